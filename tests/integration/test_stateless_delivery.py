"""A stateless republisher has no outbox by default (no store at all): a delivery that
fails past its bounds fails the pipeline, nothing is committed past it, and the input
replays from the last commit."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from test_exclusive_republish import (
    PARTITIONS,
    drained,
    expected_parts,
    setup,
    written_parts,
)

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens once the socket is closed


def test_without_a_store_a_failed_delivery_restarts_and_the_input_replays(
    kafka_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    topics, ends, inputs = setup(kafka_service, unique_name, 200)
    group, output = unique_name("g"), topics["ONCEFLOW_MIRROR_OUTPUT"]
    nowhere = closed_port()
    settings = {"onceflow.pipeline": "onceflow.examples.mirror:mirror",
                "onceflow.kafka.bootstrap-servers": kafka_service.address,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://127.0.0.1:{nowhere}/0",
                "onceflow.stores.cassandra.contact-points": "127.0.0.1",
                "onceflow.stores.cassandra.port": str(nowhere),
                "onceflow.kafka.producer.delivery-timeout": "1s",
                "onceflow.commit.interval": "200ms"}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    env = {**os.environ, **topics}
    failing = harness.WorkerProcess(argv, {**env, "ONCEFLOW_FAULT_PRODUCE_FAILS": output},
                                    tmp_path, "failing")
    failing.start()
    log, deadline = failing.logs[-1], time.monotonic() + 60
    while "restarting ['core'" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    assert "stores: none (" in text, f"see {log}"
    assert "records not delivered after" in text and "restarting ['core'" in text, f"see {log}"
    assert "to the outbox" not in text, f"see {log}"

    async def committed() -> dict[int, int]:
        async with harness.CommittedOffsets(kafka_service.address, group) as offsets:
            return await offsets.read(topics["ONCEFLOW_MIRROR_TOPIC"], list(range(PARTITIONS)))

    assert asyncio.run(committed()) == dict.fromkeys(range(PARTITIONS), 0)  # nothing past it
    failing.kill()
    successor = harness.WorkerProcess(argv, env, tmp_path, "successor")
    successor.start()
    asyncio.run(drained(kafka_service, group, topics["ONCEFLOW_MIRROR_TOPIC"], ends, successor))
    assert successor.terminate(10) == 0
    outputs = asyncio.run(harness.read_all(kafka_service.address, output, PARTITIONS, quiet=1.0))
    assert written_parts(outputs) == expected_parts(inputs)  # each part once, in order
