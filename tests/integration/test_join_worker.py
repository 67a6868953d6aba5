"""A join in the real worker: a replay after a SIGKILL meets the table version its
first run met, through the merge log topic (Kafka and Redis for real).

The first worker enriches payments while every merchant is in category A, then
applies the table's change of every merchant to B, persists both, and is killed
with nothing committed: its successor replays every payment and every table record.
With the merge log the replayed payments meet A again (discarded as duplicates by
the totals, republished as A); without it (``ONCEFLOW_FAULT_NO_MERGE_LOG``) they meet
B, and the totals count them twice. Start-up refuses topics of other counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.declarations import MERGE_LOG_STAGE
from onceflow.stages.merge_log import decode_start
from onceflow.stages.state import decode_state
from onceflow.stores.redis_store import RedisStore

PARTITIONS = 2
MERCHANTS = [f"m{i}" for i in range(8)]
HERE = str(Path(__file__).parent)


def rows(category: str) -> list[tuple[bytes | None, bytes]]:
    return [(m.encode(), json.dumps({"cat": category}).encode()) for m in MERCHANTS]


def payments(first: int, n: int) -> list[tuple[bytes | None, bytes]]:
    """Keyed by merchant, as the table is: partition p of both holds a merchant's."""
    return [(MERCHANTS[i % len(MERCHANTS)].encode(),
             json.dumps({"id": i, "merchant": MERCHANTS[i % len(MERCHANTS)],
                         "amount": 1 + i % 5}).encode()) for i in range(first, first + n)]


def total(messages: list[tuple[bytes | None, bytes]]) -> int:
    return sum(json.loads(value)["amount"] for _, value in messages)


class Setup:
    def __init__(self, kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                 unique_name: Callable[..., str], table_partitions: int = PARTITIONS):
        self.kafka, self.redis, self.tmp_path = kafka, redis, tmp_path
        self.pay, self.merch, self.out = (unique_name("pay"), unique_name("merch"),
                                          unique_name("out"))
        self.group, self.prefix, self.id = unique_name("g"), unique_name("p"), unique_name("j")
        for topic, n in ((self.pay, PARTITIONS), (self.merch, table_partitions),
                         (self.out, PARTITIONS)):
            asyncio.run(harness.create_topic(kafka.address, topic, n))
        self.store = RedisStore(f"redis://{redis.address}/0", self.prefix, self.id)
        self.workers: list[harness.WorkerProcess] = []

    def settings(self, commit: str) -> dict[str, str]:
        return {"onceflow.pipeline": "join_pipeline:pipeline",
                "onceflow.kafka.bootstrap-servers": self.kafka.address,
                "onceflow.kafka.group-id": self.group,
                "onceflow.stores.redis.url": f"redis://{self.redis.address}/0",
                "onceflow.stores.redis.key-prefix": self.prefix,
                "onceflow.commit.interval": commit,
                "onceflow.single-worker": "true",  # totals per category: fed from both
                "onceflow.persistence.interval": "200ms"}

    def env(self, naive: bool) -> dict[str, str]:
        path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_JOIN_ID": self.id,
               "ONCEFLOW_JOIN_PAYMENTS": self.pay,
               "ONCEFLOW_JOIN_MERCHANTS": self.merch, "ONCEFLOW_JOIN_OUTPUT": self.out}
        return {**env, "ONCEFLOW_FAULT_NO_MERGE_LOG": "1"} if naive else env

    def worker(self, name: str, commit: str, naive: bool) -> harness.WorkerProcess:
        argv = harness.worker_command(harness.packaged_config("demo.conf"),
                                      self.settings(commit))
        process = harness.WorkerProcess(argv, self.env(naive), self.tmp_path, name)
        process.start()
        self.workers.append(process)
        return process

    def stop(self) -> None:
        """Kill what a failed test left running."""
        for process in self.workers:
            if process.exited() is None:
                process.kill()

    def pay_and_wait(self, messages: list[tuple[bytes | None, bytes]],
                     worker: harness.WorkerProcess) -> None:
        """Produce payments, then wait until the group committed past them."""
        ends = asyncio.run(harness.produce(self.kafka.address, self.pay, messages))

        async def drained() -> bool:
            async with harness.CommittedOffsets(self.kafka.address, self.group) as offsets:
                return await offsets.wait_for(self.pay, ends, 90, worker)
        assert asyncio.run(drained()), worker.log_tail()

    def states(self, stage: str) -> dict[str, object]:
        return {key: decode_state(value).value for key, value in self.store.scan(stage)}

    def wait(self, what: str, check: Callable[[], bool], process: harness.WorkerProcess,
             timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            assert process.exited() is None, f"worker exited: {process.log_tail()}"
            time.sleep(0.1)
        raise AssertionError(f"{what} not seen in {timeout}s: {process.log_tail()}")


def table_at(setup: Setup, category: str) -> Callable[[], bool]:
    def check() -> bool:
        found = setup.states("merchant")
        return len(found) == len(MERCHANTS) and all(
            isinstance(v, list) and v and v[-1][1] == {"cat": category} for v in found.values())
    return check


@pytest.mark.parametrize("naive", [False, True], ids=["merge-log", "no-merge-log"])
def test_a_replay_after_sigkill_meets_the_table_version_of_its_first_run(
    naive: bool, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    setup = Setup(kafka_service, redis_service, tmp_path, unique_name)
    try:
        run_and_replay(setup, naive)
    finally:
        setup.stop()


def run_and_replay(setup: Setup, naive: bool) -> None:
    kafka_service = setup.kafka
    asyncio.run(harness.produce(kafka_service.address, setup.merch, rows("A")))
    dying = setup.worker("dying", "1h", naive)  # never commits: everything replays
    setup.wait("the table at A", table_at(setup, "A"), dying)
    first = payments(0, 200)
    asyncio.run(harness.produce(kafka_service.address, setup.pay, first))
    setup.wait("payments folded under A",
               lambda: setup.states("totals") == {"A": total(first)}, dying)
    asyncio.run(harness.produce(kafka_service.address, setup.merch, rows("B")))
    setup.wait("the table at B", table_at(setup, "B"), dying)
    dying.kill()

    successor = setup.worker("successor", "300ms", naive)
    later = payments(200, 40)
    setup.pay_and_wait(later, successor)
    assert successor.terminate(15) == 0
    outputs = asyncio.run(harness.read_all(kafka_service.address, setup.out, PARTITIONS,
                                           quiet=1.0))
    seen: dict[int, set[str]] = {}
    for record in outputs:
        value = json.loads(Envelope.FromString(record.value or b"").payload)
        seen.setdefault(value["id"], set()).add(value["cat"])
    totals = setup.states("totals")
    if naive:  # the replay met B: the first 200 payments counted under A and again under B
        assert totals == {"A": total(first), "B": total(first) + total(later)}
        assert any(cats == {"A", "B"} for cats in seen.values())
        return
    assert totals == {"A": total(first), "B": total(later)}
    assert {i: cats for i, cats in seen.items() if i < 200} == {i: {"A"} for i in range(200)}
    assert {i: cats for i, cats in seen.items() if i >= 200} == {
        i: {"B"} for i in range(200, 240)}
    # The successor's commits moved where the log is read from: the next worker starts
    # there (not at the log's start), and goes on exactly.
    stored = dict(setup.store.scan(MERGE_LOG_STAGE))
    start = decode_start(stored["0"])
    assert start is not None and start.offset > 0, stored
    third = setup.worker("third", "300ms", naive)
    more = payments(240, 16)
    setup.pay_and_wait(more, third)
    # and its own commits move the start on (the table idle all the while)
    def moved() -> bool:
        now = decode_start(dict(setup.store.scan(MERGE_LOG_STAGE))["0"])
        return now is not None and now.offset > start.offset
    setup.wait("the merge log's start moved on", moved, third, timeout=30)
    assert third.terminate(15) == 0
    assert f"[0] read from offset {start.offset} to" in third.logs[-1].read_text(), \
        third.log_tail()
    assert setup.states("totals") == {"A": total(first), "B": total(later) + total(more)}


def test_a_table_with_another_partition_count_is_refused_at_start(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    setup = Setup(kafka_service, redis_service, tmp_path, unique_name, table_partitions=3)
    argv = harness.worker_command(harness.packaged_config("demo.conf"), setup.settings("1s"))
    done = subprocess.run(argv, env=setup.env(False),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert (f"join 'merchant': stream topic {setup.pay!r} has 2 partitions, table topic "
            f"{setup.merch!r} has 3: a join needs the same count on both") in done.stderr
