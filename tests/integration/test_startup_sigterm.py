"""SIGTERM at every moment of a worker's start-up: exit 0 promptly, commit only what is durable.

Each test starts a real worker process on the real broker and Redis and
sends SIGTERM at one moment: as soon as the process catches the signal
(before the actors exist), while its consumer joins the group, while it
processes its first records, and while the supervisor backs off before a
restart. The bound on the exit is the shutdown timeout plus 10 s, which the
old start-up exceeded (it killed the process with -15 before the handlers
were installed, waited for the join, and exited 1 after a drain timeout).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    committed,
    consume_all,
    create_topic,
    expected_counts,
    produce,
    start_worker,
    stored_states,
    wait_for_log,
)

from onceflow.devtools.robot_stream import generate, parse_report, report_id
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

SHUTDOWN_TIMEOUT = 10.0  # reference.conf's onceflow.shutdown.timeout
BOUND = SHUTDOWN_TIMEOUT + 10


class Run:
    """One worker process on a fresh topic, group and key prefix."""

    def __init__(self, kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                 unique_name: Callable[..., str], partitions: int):
        self.bootstrap = kafka.address
        self.redis_url = f"redis://{redis.address}/0"
        self.topic, self.group = unique_name("robots"), unique_name("g")
        self.prefix = unique_name("p")
        self.partitions = partitions
        self.log = tmp_path / "worker.log"
        create_topic(self.bootstrap, self.topic, partitions)

    def start(self, extra: list[str]) -> subprocess.Popen[bytes]:
        return start_worker(self.bootstrap, self.redis_url, self.group, self.prefix,
                            self.topic, self.log, extra)

    def sigterm(self, worker: subprocess.Popen[bytes]) -> int:
        """SIGTERM; the exit code, within the bound (else the worker is killed and we fail)."""
        worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            raise AssertionError(f"no exit {BOUND}s after SIGTERM:\n{self.text()[-3000:]}"
                                 ) from None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def committed(self) -> dict[int, int]:
        return committed(self.bootstrap, self.group, self.topic, self.partitions)

    def stored(self) -> dict[str, dict[str, int]]:
        store = RedisStore(self.redis_url, self.prefix, "robots")
        try:
            return stored_states(store, "per_robot")
        finally:
            store.close()

    def truth_below(self, offsets: dict[int, int], produced: int) -> dict[str, dict[str, int]]:
        """Per-robot counts of the records below ``offsets`` (the committed prefix)."""
        truth: dict[str, Counter[str]] = {}
        for record in consume_all(self.bootstrap, self.topic, produced):
            if record.offset < offsets.get(record.partition, 0):
                report = parse_report(record.value)
                counts = truth.setdefault(report["serial"], Counter())
                counts.update("ok" if r["ok"] else "failed" for r in report["results"])
        return expected_counts(truth)


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a SIGTERM handler yet (Linux: SigCgt in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_sigterm_as_soon_as_the_handler_exists_stops_before_any_actor(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    run = Run(kafka_service, redis_service, tmp_path, unique_name, partitions=2)
    produce(run.bootstrap, run.topic, generate(500, seed=1).messages)
    worker = run.start([])
    deadline = time.monotonic() + 30
    while not catches_sigterm(worker.pid):  # the earliest moment the handler exists
        assert worker.poll() is None and time.monotonic() < deadline, run.text()
        time.sleep(0.001)

    assert run.sigterm(worker) == 0, run.text()[-3000:]
    # The worker was still loading its modules: it never built an actor.
    assert "stop requested while loading: no actor was built" in run.text()
    assert "worker started:" not in run.text()
    assert run.committed() == {0: 0, 1: 0}


def test_sigterm_while_the_consumer_joins_the_group(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    run = Run(kafka_service, redis_service, tmp_path, unique_name, partitions=2)
    produce(run.bootstrap, run.topic, generate(500, seed=2).messages)
    # A join on Tansu takes half the session timeout: 15 s here, longer than
    # the shutdown timeout, as in the incident (exit 1 after the drain timed out).
    worker = run.start(["--set", "onceflow.kafka.session-timeout=30s"])
    wait_for_log(worker, run.log, "(Re-)joining group", timeout=60)

    assert run.sigterm(worker) == 0, run.text()[-3000:]
    text = run.text()
    stopping = text.index("received SIGTERM")
    assert "partitions assigned" not in text[:stopping], text[-3000:]
    assert "'records': " not in text  # nothing was fetched, so nothing to commit
    assert run.committed() == {0: 0, 1: 0}
    assert run.stored() == {}


def test_sigterm_while_processing_the_first_records_commits_only_what_it_persisted(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    run = Run(kafka_service, redis_service, tmp_path, unique_name, partitions=4)
    produced = 20_000
    produce(run.bootstrap, run.topic, generate(produced, seed=3).messages)
    # One record per batch, one batch in flight: the records take seconds to
    # process, so SIGTERM lands mid-way, after some offsets were committed.
    worker = run.start(["--set", "onceflow.kafka.max-poll-records=1",
                        "--set", "onceflow.consumer.max-in-flight-batches=1",
                        "--set", "onceflow.persistence.interval=100ms",
                        "--set", "onceflow.commit.interval=200ms"])
    wait_for_log(worker, run.log, "partitions assigned", timeout=60)
    time.sleep(0.5)  # about a quarter of the records (measured: ~11,000 a second)

    assert run.sigterm(worker) == 0, run.text()[-3000:]
    offsets = run.committed()
    assert 0 < sum(offsets.values()) < produced, offsets  # stopped mid-way
    assert run.stored() == run.truth_below(offsets, produced)


def test_sigterm_while_the_supervisor_backs_off_before_a_restart(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(kafka_service, redis_service, tmp_path, unique_name, partitions=1)
    stream = generate(200, seed=4)
    produce(run.bootstrap, run.topic, stream.messages)
    # The pipeline actor fails on the first record, so the pipeline restarts after 60 s.
    poison = report_id(stream.messages[0][1]).decode()
    monkeypatch.setenv("ONCEFLOW_FAULT_STAGE_RAISES_ON", poison)  # the worker inherits it
    worker = run.start(["--set", "onceflow.supervision.backoff.initial=60s"])
    wait_for_log(worker, run.log, "restarting ['core', 'consumer'] in", timeout=60)

    assert run.sigterm(worker) == 0, run.text()[-3000:]
    assert run.committed() == {0: 0}
    assert run.stored() == {}
