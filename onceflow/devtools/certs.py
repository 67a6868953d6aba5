"""A throwaway certificate authority for local TLS services (tests, dev runs).

Made with the ``openssl`` command (no Python crypto package is a dependency):
a CA, a server certificate for 127.0.0.1/localhost, and a client certificate,
all PEM, valid for two days. ``pkcs12`` bundles a certificate and its key for
Java services (Cassandra reads its key from a keystore, not from PEM files).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LocalPki", "make_pki", "pkcs12"]

_DAYS = "2"
_SERVER_EXT = ("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
               "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
_CLIENT_EXT = "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n"


@dataclass(frozen=True)
class LocalPki:
    """PEM files: the CA, a server certificate and key, a client certificate and key."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError("openssl not found: apt-get install -y openssl")
    subprocess.run([binary, *args], check=True, capture_output=True)


def make_pki(directory: Path, name: str = "onceflow test CA") -> LocalPki:
    """A new CA under ``directory`` and a server and a client certificate it signed."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", _DAYS,
             "-keyout", str(ca_key), "-out", str(ca), "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    signed = [_signed(directory, ca, ca_key, who, extensions)
              for who, extensions in (("server", _SERVER_EXT), ("client", _CLIENT_EXT))]
    (server_cert, server_key), (client_cert, client_key) = signed
    return LocalPki(ca, server_cert, server_key, client_cert, client_key)


def _signed(directory: Path, ca: Path, ca_key: Path, who: str, extensions: str
            ) -> tuple[Path, Path]:
    key, request, cert = (directory / f"{who}.{ext}" for ext in ("key", "csr", "pem"))
    ext_file = directory / f"{who}.ext"
    ext_file.write_text(extensions)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
             "-subj", f"/CN={'127.0.0.1' if who == 'server' else 'onceflow'}")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", _DAYS, "-out", str(cert), "-extfile", str(ext_file))
    return cert, key


def pkcs12(cert: Path, key: Path, out: Path, password: str) -> Path:
    """``cert`` and ``key`` as one PKCS#12 keystore (what Java services load)."""
    _openssl("pkcs12", "-export", "-in", str(cert), "-inkey", str(key), "-name", "server",
             "-out", str(out), "-passout", f"pass:{password}")
    return out
