"""Test certificates made with the ``openssl`` command: a CA, a server and a client.

EC keys (P-256), so making them takes milliseconds. The server certificate
names 127.0.0.1 and localhost; the client key is encrypted with a password.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path  # encrypted with client_key_password
    client_key_password: str


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory: Path, name: str = "ca") -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key)."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl("req", "-x509", *_EC, "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "2", "-subj", f"/CN=onceflow test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def _signed(directory: Path, name: str, ca: tuple[Path, Path], san: str,
            password: str | None) -> tuple[Path, Path]:
    cert, key, csr = (directory / f"{name}.pem", directory / f"{name}.key",
                      directory / f"{name}.csr")
    secret = ["-passout", f"pass:{password}"] if password else ["-nodes"]
    _openssl("req", *_EC, *secret, "-keyout", str(key), "-out", str(csr),
             "-subj", f"/CN={name}")
    ext = directory / f"{name}.ext"
    ext.write_text(f"basicConstraints=CA:FALSE\nsubjectAltName={san}\n"
                   "authorityKeyIdentifier=keyid,issuer\n", encoding="utf-8")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return cert, key


def make_certs(directory: Path, client_key_password: str = "client-key-pw") -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory)
    server = _signed(directory, "server", ca, "IP:127.0.0.1,DNS:localhost", None)
    client = _signed(directory, "client", ca, "DNS:onceflow-client", client_key_password)
    return Certs(ca[0], server[0], server[1], client[0], client[1], client_key_password)
