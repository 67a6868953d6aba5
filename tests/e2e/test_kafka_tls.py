"""Kafka over TLS: a worker whose every client (consumer, producer, admin) speaks TLS
with a client certificate and an encrypted key counts exactly; a client that trusts
another CA fails with a certificate verify error.

The local broker (Tansu) is reached through a TLS-terminating proxy that asks for
client certificates (``tls_broker``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from helpers import expected_counts, stored_states
from tls_broker import TlsBroker, tls_broker
from tls_certs import make_ca

from onceflow.devtools import harness
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TlsBroker]:
    with tls_broker(tmp_path) as b:
        yield b


def test_a_worker_over_mutual_tls_counts_exactly(
    broker: TlsBroker, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    b = broker
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
    broker: TlsBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    other_ca, _ = make_ca(tmp_path, "other-ca")
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(harness.create_topic(broker.bootstrap, "t", 1,
                                         broker.security(ca=other_ca)))
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text, caplog.text
    assert broker.proxy.peers == []  # the handshake never completed
