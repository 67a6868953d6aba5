"""Kafka over TLS: a worker whose every client (consumer, producer, admin) speaks TLS
with a client certificate and an encrypted key counts exactly; a client that trusts
another CA fails with a certificate verify error.

The local broker (Tansu) is reached through a TLS-terminating proxy that asks for
client certificates, and advertises the proxy's address, so every connection the
clients make after bootstrap goes through TLS as well.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from helpers import expected_counts, stored_states
from proxy import CuttableProxy
from tls_certs import Certs, make_ca, make_certs

from onceflow.devtools import harness, services
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.runtime.kafka_security import KafkaSasl, KafkaSecurity, KafkaSsl
from onceflow.runtime.secrets import Secret
from onceflow.stores.redis_store import RedisStore


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
        """``--set`` overrides (the key password comes from the environment, never --set)."""
        k, c = "onceflow.kafka.", self.certs
        return {k + "bootstrap-servers": self.bootstrap, k + "security-protocol": "SSL",
                k + "ssl.ca-file": str(c.ca), k + "ssl.cert-file": str(c.client_cert),
                k + "ssl.key-file": str(c.client_key)}


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[TlsBroker]:
    certs = make_certs(tmp_path / "certs")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.server_cert, certs.server_key)
    server.load_verify_locations(certs.ca)
    server.verify_mode = ssl.CERT_REQUIRED  # Kafka's ssl.client.auth = required
    proxy_port = services.free_port()
    kafka = services.start_tansu(tmp_path / "kafka", advertised_port=proxy_port)
    proxy = CuttableProxy(proxy_port, kafka.port, tls=server)
    try:
        yield TlsBroker(f"127.0.0.1:{proxy_port}", certs, proxy)
    finally:
        proxy.close()
        services.stop(kafka)


def test_a_worker_over_mutual_tls_counts_exactly(
    tls_broker: TlsBroker, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    b = tls_broker
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    security = b.security()
    asyncio.run(harness.create_topic(b.bootstrap, topic, 4, security))
    stream = generate(20_000, seed=14)
    ends = asyncio.run(harness.produce(b.bootstrap, topic, stream.messages, security=security))
    settings = {**b.worker_settings(), "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": redis_url, "onceflow.stores.redis.key-prefix": prefix}
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic,
           "ONCEFLOW_KAFKA_SSL_KEY_PASSWORD": b.certs.client_key_password}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings), env, tmp_path)
    worker.start()
    try:
        async def drained() -> bool:
            async with harness.CommittedOffsets(b.bootstrap, group, security) as offsets:
                return await offsets.wait_for(topic, ends, 120, worker)

        assert asyncio.run(drained()), f"see {worker.logs[-1]}"
        assert worker.terminate(10) == 0, worker.logs[-1].read_text()[-3000:]
    finally:
        if worker.exited() is None:
            worker.kill()
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == expected_counts(stream.truth)
    finally:
        store.close()
    # Every connection (the test's and the worker's) presented the client certificate.
    assert len(b.proxy.peers) >= 4 and set(b.proxy.peers) == {"client"}


def test_a_client_that_trusts_another_ca_fails_with_a_verify_error(
    tls_broker: TlsBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    other_ca, _ = make_ca(tmp_path, "other-ca")
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(harness.create_topic(tls_broker.bootstrap, "t", 1,
                                         tls_broker.security(ca=other_ca)))
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text, caplog.text
    assert tls_broker.proxy.peers == []  # the handshake never completed
