"""Small real-service helpers shared by integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.producer import message_accumulator, producer
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

from onceflow.devtools import harness
from onceflow.devtools.certs import LocalPki
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.services import ServiceInfo
from onceflow.stages.state import decode_state
from onceflow.stores.base import StateStore
from onceflow.testing import partition_for


@dataclass(frozen=True)
class SecureService:
    """A store that wants a login and TLS: where it is, its CA and client certificate,
    and the administrator's login (user None: Redis's default user)."""

    info: ServiceInfo
    pki: LocalPki
    admin: tuple[str | None, str]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would let a fresh venv see the repo (its
    PYTHONPATH, a virtualenv) or the tests' ONCEFLOW_ variables; ``extra`` added."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items()
           if k not in dropped and not k.startswith("ONCEFLOW_")}
    return {**env, **extra}


def stored_states(store: StateStore, stage: str) -> dict[str, Any]:
    """Every state of an aggregate stage, decoded: key -> value."""
    return {key: decode_state(value).value for key, value in store.scan(stage)}


def expected_counts(*truths: Mapping[str, Counter[str]]) -> dict[str, dict[str, int]]:
    """The per-robot ``{"ok", "failed"}`` states the ground truth implies (streams add up)."""
    total: dict[str, Counter[str]] = {}
    for truth in truths:
        for robot, counts in truth.items():
            total[robot] = total.get(robot, Counter()) + counts
    return {robot: {"ok": c["ok"], "failed": c["failed"]} for robot, c in total.items()}


def key_on(partition: int, partitions: int) -> bytes:
    """A record key that the default partitioner puts on ``partition`` of ``partitions``."""
    return next(key for n in range(1000)
                if partition_for(key := f"r{n}".encode(), partitions) == partition)


def pair_events(partitions: int, minute: int, side: int) -> list[tuple[bytes | None, bytes]]:
    """For each ordered pair (i, j) of partitions, key ``k<i><j>``'s event of ``minute``
    on partition i (``side`` 0) or j (1): one key fed from two partitions (the tests of a
    single worker's merge log, ordered_windows_pipeline.py)."""
    pairs = [(i, j) for i in range(partitions) for j in range(partitions) if i != j]
    return [(key_on(pair[side], partitions), json.dumps(
        {"k": f"k{pair[0]}{pair[1]}", "ts": minute * 60_000 + 5_000}).encode())
        for pair in pairs]


def caught_up(bootstrap: str, group: str, topic: str, ends: Mapping[int, int],
              timeout: float, worker: harness.WorkerProcess) -> bool:
    """Whether ``group`` committed ``ends`` of ``topic`` within ``timeout`` (False at once
    if ``worker`` exits)."""
    async def wait() -> bool:
        async with harness.CommittedOffsets(bootstrap, group) as committed:
            return await committed.wait_for(topic, ends, timeout, worker)

    return asyncio.run(wait())


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    asyncio.run(harness.create_topic(bootstrap, topic, partitions))


def produce(bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes]]
            ) -> dict[int, int]:
    """Produce in order; returns the end offset per partition from the acks."""
    return asyncio.run(harness.produce(bootstrap, topic, messages))


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    async def read() -> dict[int, int]:
        async with harness.CommittedOffsets(bootstrap, group) as offsets:
            return await offsets.read(topic, range(partitions))

    return asyncio.run(read())


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 30):  # type: ignore[no-untyped-def]
    """Read ``expected`` records from the start of ``topic`` (no group)."""

    async def read():  # type: ignore[no-untyped-def]
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        records = []
        try:
            deadline = time.monotonic() + timeout
            while len(records) < expected and time.monotonic() < deadline:
                for recs in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(recs)
            return records
        finally:
            await consumer.stop()

    return asyncio.run(read())


def start_worker(bootstrap: str, redis_url: str, group: str, prefix: str, topic: str,
                 log: Path, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    argv = harness.worker_command(harness.packaged_config("demo.conf"),
                                  redis_settings(bootstrap, redis_url, group, prefix))
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}
    with log.open("wb") as out:
        return subprocess.Popen(harness.fault_aware([*argv, *extra], env), env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def exit_code_within(worker: subprocess.Popen[bytes], bound: float, log: Path,
                     what: str) -> int:
    """The worker's exit code if it exits within ``bound`` s; else it is killed and the test
    fails with ``what`` (e.g. "no exit after SIGTERM") and the log's tail."""
    try:
        return worker.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        raise AssertionError(f"{what} ({bound:.0f}s):\n"
                             f"{log.read_text(errors='replace')[-3000:]}") from None


def wait_for_log(proc: subprocess.Popen[bytes], log: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"worker exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in log after {timeout}s:\n{log.read_text()[-3000:]}")



class RawName(str):
    """A header name written as ``raw`` bytes, UTF-8 or not (as a hand-made batch can)."""

    def __new__(cls, raw: bytes) -> RawName:
        named = super().__new__(cls, raw.decode(errors="surrogateescape"))
        named.raw = raw
        return named

    raw: bytes

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


@contextlib.contextmanager
def raw_header_names() -> Iterator[None]:
    """Producers write ``RawName``s as their bytes meanwhile (only in this process).

    aiokafka's C batch builder encodes a header name itself and refuses a ``str``
    subclass; its pure-Python one calls ``.encode()``, which ``RawName`` answers.
    Batches are built as ``send`` (or ``create_batch``) starts them.
    """
    modules = (message_accumulator, producer)
    saved = [module.DefaultRecordBatchBuilder for module in modules]
    for module in modules:
        module.DefaultRecordBatchBuilder = _DefaultRecordBatchBuilderPy
    try:
        yield
    finally:
        for module, builder in zip(modules, saved, strict=True):
            module.DefaultRecordBatchBuilder = builder


def assert_history_and_outbox_fenced(old: StateStore, held: Mapping[tuple[str, int], int]
                                     ) -> None:
    """A store client holding stale epochs (``held``) writes no history or outbox row."""
    import pytest

    from onceflow.stores.fencing import Fenced

    for retention in (0.0, 60.0):  # history rows, plain and expiring
        old.history_retention = retention
        with pytest.raises(Fenced):
            old.save_history("s", {("k", 0): b"w"}, guard=held)
        assert list(old.scan_history("s")) == []
    with pytest.raises(Fenced):
        old.outbox_append({("out|0", 7): b"r"}, guard=held)
    assert old.outbox_load() == {}


def redis_state_ttl(raw: Any, namespace: str, pipeline: str, stage: str, key: str
                    ) -> float | None:
    """Seconds left of a stored state's Redis expiry, None if it has none; asserts it is there."""
    ms = raw.pttl(f"{namespace}:{pipeline}:s:{stage}:{key}")
    assert ms != -2, f"{stage}:{key} is absent"
    return None if ms == -1 else ms / 1000


def cassandra_state_ttl(session: Any, namespace: str, pipeline: str, stage: str, key: str
                        ) -> float | None:
    """Seconds left of a stored state's Cassandra TTL, None if it has none; asserts it is there."""
    row = session.execute(
        f'SELECT TTL(value) FROM "{namespace}".states '
        "WHERE pipeline = %s AND stage = %s AND key = %s", (pipeline, stage, key)
    ).one()
    assert row is not None, f"{stage}:{key} is absent"
    return None if row[0] is None else float(row[0])


def run_reconcile(settings: Mapping[str, str], env: Mapping[str, str], out: Path,
                  *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``onceflow reconcile -c demo.conf --set ... --report out [extra]`` as a subprocess:
    its outcome and its JSON report."""
    argv = [sys.executable, "-m", "onceflow", "reconcile", "-c",
            str(harness.packaged_config("demo.conf")), "--report", str(out), *extra]
    for key, value in settings.items():
        bare = value.isdigit() or value in ("true", "false")
        argv += ["--set", f"{key}={value}" if bare else f'{key}="{value}"']
    done = subprocess.run(argv, env={**env, "COLUMNS": "200"}, capture_output=True, text=True,
                          timeout=300)
    report = out / "reconcile.json"
    assert report.exists(), f"exit {done.returncode}: {done.stdout}\n{done.stderr}"
    return done, json.loads(report.read_text())
