"""A private Tansu behind a TLS-terminating proxy that requires client certificates.

The local broker has no TLS of its own. It advertises the proxy's address,
so every connection a client makes after bootstrap goes through TLS too.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from proxy import CuttableProxy
from tls_certs import Certs, make_certs

from onceflow.devtools import services
from onceflow.runtime.kafka_security import KafkaSasl, KafkaSecurity, KafkaSsl
from onceflow.runtime.secrets import Secret


@dataclass(frozen=True)
class TlsBroker:
    bootstrap: str
    certs: Certs
    proxy: CuttableProxy

    def security(self, ca: Path | None = None) -> KafkaSecurity:
        """Mutual TLS as a client of this broker (trusting ``ca`` instead, if given)."""
        c = self.certs
        return KafkaSecurity("SSL", KafkaSsl(str(ca or c.ca), str(c.client_cert),
                                             str(c.client_key), Secret(c.client_key_password),
                                             True), KafkaSasl("PLAIN", None, None))

    def worker_settings(self) -> dict[str, str]:
        """``--set`` overrides (the key password comes from elsewhere, never --set)."""
        k, c = "onceflow.kafka.", self.certs
        return {k + "bootstrap-servers": self.bootstrap, k + "security-protocol": "SSL",
                k + "ssl.ca-file": str(c.ca), k + "ssl.cert-file": str(c.client_cert),
                k + "ssl.key-file": str(c.client_key)}


@contextmanager
def tls_broker(directory: Path, client_key_password: str = "client-key-pw"
               ) -> Iterator[TlsBroker]:
    certs = make_certs(directory / "certs", client_key_password)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.server_cert, certs.server_key)
    server.load_verify_locations(certs.ca)
    server.verify_mode = ssl.CERT_REQUIRED  # Kafka's ssl.client.auth = required
    proxy_port = services.free_port()
    kafka = services.start_tansu(directory / "kafka", advertised_port=proxy_port)
    proxy = CuttableProxy(proxy_port, kafka.port, tls=server)
    try:
        yield TlsBroker(f"127.0.0.1:{proxy_port}", certs, proxy)
    finally:
        try:
            proxy.close()
        finally:  # the broker goes whatever the proxy's close raised
            services.stop(kafka)
