"""The worker process with its aggregate state in a real Cassandra 2.1.

The robot pipeline runs with ``ONCEFLOW_ROBOTS_STORE=cassandra``; the Redis
URL the shared helpers pass points at a closed port, so these runs also show
that a Cassandra-only pipeline never needs Redis.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from helpers import (
    committed,
    create_topic,
    expected_counts,
    produce,
    start_worker,
    stored_states,
    wait_for_log,
)

from onceflow.devtools.robot_stream import RobotStream, generate
from onceflow.devtools.services import ServiceInfo, free_port
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, PartitionSequences
from onceflow.stores.cassandra_store import CassandraStore

PIPELINE_ID, STAGE_ID = "robots", "per_robot"  # fixed by onceflow.examples.robots
FAST_STATS = ["--set", "onceflow.metrics.stats-interval=200ms"]
NO_COMMIT_TICKS = ["--set", "onceflow.commit.interval=1h"]


def cassandra_args(cassandra: ServiceInfo, keyspace: str) -> list[str]:
    sets = {
        "contact-points": f'["{cassandra.host}"]',
        "port": str(cassandra.port),
        "keyspace": f'"{keyspace}"',
        "protocol-version": "3",
    }
    return [arg for key, value in sets.items()
            for arg in ("--set", f"onceflow.stores.cassandra.{key}={value}")]


def open_store(cassandra: ServiceInfo, keyspace: str) -> CassandraStore:
    return CassandraStore([cassandra.host], PIPELINE_ID, port=cassandra.port,
                          keyspace=keyspace, protocol_version=3)


def robot_totals(cassandra: ServiceInfo, keyspace: str) -> dict[str, dict[str, int]]:
    store = open_store(cassandra, keyspace)
    try:
        return stored_states(store, STAGE_ID)
    finally:
        store.close()


def truth(stream: RobotStream) -> dict[str, dict[str, int]]:
    return expected_counts(stream.truth)


class Run:
    """One robot topic and consumer group, and a worker on Cassandra started against them."""

    def __init__(self, kafka: ServiceInfo, cassandra: ServiceInfo, tmp_path: Path,
                 unique_name: Callable[..., str], partitions: int = 4) -> None:
        self.kafka, self.cassandra, self.tmp_path = kafka, cassandra, tmp_path
        self.topic, self.group = unique_name("robots"), unique_name("g")
        self.keyspace, self.partitions = unique_name("ks"), partitions
        self.no_redis = f"redis://127.0.0.1:{free_port()}/0"
        create_topic(kafka.address, self.topic, partitions)

    def produce(self, stream: RobotStream) -> dict[int, int]:
        ends = produce(self.kafka.address, self.topic, stream.messages)
        return {p: ends.get(p, 0) for p in range(self.partitions)}

    def start(self, log: str, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        return start_worker(self.kafka.address, self.no_redis, self.group, "unused", self.topic,
                            self.tmp_path / log,
                            [*cassandra_args(self.cassandra, self.keyspace), *extra])

    def committed(self) -> dict[int, int]:
        return committed(self.kafka.address, self.group, self.topic, self.partitions)

    def totals(self) -> dict[str, dict[str, int]]:
        return robot_totals(self.cassandra, self.keyspace)

    def sequences_cover(self) -> int:
        """Source records the stored producer-sequence tables cover (sum of next offsets)."""
        store = open_store(self.cassandra, self.keyspace)
        try:
            return sum(PartitionSequences.decode(row).next_offset
                       for _, row in store.scan(SEQUENCE_STAGE))
        finally:
            store.close()

    def stats(self) -> dict[str, int]:
        store = open_store(self.cassandra, self.keyspace)
        try:
            return store.read_stats()
        finally:
            store.close()


def stop(worker: subprocess.Popen[bytes], log: Path, timeout: float = 15) -> None:
    """SIGTERM and expect a clean exit 0."""
    try:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=timeout)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert code == 0, log.read_text()[-3000:]


@pytest.fixture
def run(kafka_service: ServiceInfo, cassandra_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("ONCEFLOW_ROBOTS_STORE", "cassandra")  # read by start_worker's child
    return Run(kafka_service, cassandra_service, tmp_path, unique_name)


def test_worker_on_cassandra_totals_match_and_offsets_are_committed(run: Run) -> None:
    stream = generate(5_000, seed=11)
    ends = run.produce(stream)
    worker = run.start("worker.log", FAST_STATS)
    wait_for_log(worker, run.tmp_path / "worker.log", "'records': 5000", timeout=120)

    stop(worker, run.tmp_path / "worker.log")

    assert run.committed() == ends
    assert run.totals() == truth(stream)
    assert run.stats()["records"] == 5000


def test_replay_after_sigkill_is_skipped_by_the_sequence_tables_in_cassandra(run: Run) -> None:
    stream = generate(3_000, seed=12)
    ends = run.produce(stream)
    # Commits only at shutdown: everything the first worker persisted is replayed.
    first = run.start("first.log", [*NO_COMMIT_TICKS, *FAST_STATS])
    try:
        deadline = time.monotonic() + 120
        # Every state and every sequence table persisted by the ticks.
        while run.totals() != truth(stream) or run.sequences_cover() != len(stream.messages):
            assert first.poll() is None, (run.tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "states never reached the ground truth"
            time.sleep(0.5)
        assert sum(run.committed().values()) == 0
    finally:
        first.kill()
        first.wait()

    second = run.start("second.log", [*NO_COMMIT_TICKS, *FAST_STATS])
    wait_for_log(second, run.tmp_path / "second.log", "'records': 3000", timeout=120)
    stop(second, run.tmp_path / "second.log")

    assert run.committed() == ends
    assert run.totals() == truth(stream)  # the replay folded nothing twice
    # Each replayed record was skipped whole, before any step.
    assert run.stats()["source.duplicates"] == len(stream.messages)


def test_replay_after_sigkill_is_discarded_by_the_watermarks_in_cassandra(
    run: Run, monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = generate(3_000, seed=13)
    ends = run.produce(stream)
    # The first worker dies right after its first states are written, before the
    # snapshot's sequence tables: the replay passes the source and must be
    # discarded by the states' own watermarks.
    monkeypatch.setenv("ONCEFLOW_FAULT_KILL_AFTER_SAVE", STAGE_ID)
    first = run.start("first.log", [*NO_COMMIT_TICKS, *FAST_STATS])
    assert first.wait(timeout=120) == -signal.SIGKILL, \
        (run.tmp_path / "first.log").read_text()[-3000:]
    monkeypatch.delenv("ONCEFLOW_FAULT_KILL_AFTER_SAVE")
    assert run.totals(), "the first worker wrote no state"
    assert run.sequences_cover() == 0

    second = run.start("second.log", [*NO_COMMIT_TICKS, *FAST_STATS])
    wait_for_log(second, run.tmp_path / "second.log", "'records': 3000", timeout=120)
    stop(second, run.tmp_path / "second.log")

    assert run.committed() == ends
    assert run.totals() == truth(stream)  # the replay folded nothing twice
    assert run.stats()[f"{STAGE_ID}.duplicates"] > 0
