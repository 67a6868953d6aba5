"""SIGTERM in every state of a worker: exit promptly, commit only what is durable.

Each test starts a real worker process on the real broker and Redis and
sends SIGTERM at one moment: as soon as the process catches the signal
(before the actors exist), while its consumer joins the group, while it
processes its first records, and while the supervisor backs off before a
restart. The bound on the exit is the shutdown timeout plus 10 s, which the
old start-up exceeded (it killed the process with -15 before the handlers
were installed, waited for the join, and exited 1 after a drain timeout).

Then the states where a stop used to hang: the store frozen, the broker
silent (the supervisor blocked inside a child's start), a second SIGTERM;
and the broker frozen mid-processing (fetches, commits and the group leave
hang; the old worker did exit in time there, the test keeps it so). There
a short ``shutdown.timeout`` bounds the exit (+ 5 s), since past it the
worker exits anyway (1), having committed only durable offsets.
And a start-time part that fails (a taken metrics port) exits 2 before any
actor, thread or group join.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import (
    committed,
    consume_all,
    create_topic,
    exit_code_within,
    expected_counts,
    produce,
    start_worker,
    stored_states,
    wait_for_log,
)

from onceflow.devtools import services
from onceflow.devtools.robot_stream import generate, parse_report, report_id
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

SHUTDOWN_TIMEOUT = 10.0  # reference.conf's onceflow.shutdown.timeout
BOUND = SHUTDOWN_TIMEOUT + 10
SHORT = 2.0  # s: the shutdown timeout of the tests of stuck states
SHORT_BOUND = SHORT + 5


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
        return exit_code_within(worker, BOUND, self.log, "no exit after SIGTERM")

    def sigterm_within(self, worker: subprocess.Popen[bytes], bound: float = SHORT_BOUND
                       ) -> int:
        """SIGTERM; the exit code, within ``bound`` seconds (else killed, and we fail)."""
        worker.send_signal(signal.SIGTERM)
        return exit_code_within(worker, bound, self.log, "no exit after SIGTERM")

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


def assert_committed_is_stored(run: Run, offsets: dict[int, int], produced: int) -> None:
    """Every record below the committed offsets is in the stored states, which hold no
    more than was produced (a stop may leave stored records uncommitted: replayed later,
    discarded by the watermarks)."""
    stored, below = run.stored(), run.truth_below(offsets, produced)
    every = run.truth_below({p: produced for p in range(run.partitions)}, produced)
    for robot, counts in every.items():
        floor = below.get(robot, {"ok": 0, "failed": 0})
        held = stored.get(robot, {"ok": 0, "failed": 0})
        assert all(floor[k] <= held[k] <= counts[k] for k in counts), (robot, floor, held)
    assert set(stored) <= set(every)


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


def test_a_taken_metrics_port_exits_2_within_10s_before_any_actor_or_join(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    run = Run(kafka_service, redis_service, tmp_path, unique_name, partitions=1)
    produce(run.bootstrap, run.topic, generate(100, seed=5).messages)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = run.start(["--set", f"onceflow.metrics.port={port}"])
        # 10 s of its own; the bound leaves a loaded host time to start Python and import.
        code = exit_code_within(worker, 30, run.log, "still running after start")
    text = run.text()
    assert code == 2, text[-3000:]
    lines = [line for line in text.splitlines() if "onceflow.metrics.port" in line]
    assert len(lines) == 1 and f"{port} is not" in lines[0] and "expected a port free" in lines[0]
    for started in ("worker started", "(Re-)joining group", "Traceback", "child core"):
        assert started not in text, text[-3000:]
    assert run.committed() == {0: 0}


def _busy_worker(run: Run, seed: int) -> tuple[subprocess.Popen[bytes], int]:
    """A worker taking 20,000 records one per batch, once assigned: stopped mid-way."""
    produced = 20_000
    produce(run.bootstrap, run.topic, generate(produced, seed=seed).messages)
    worker = run.start(["--set", f"onceflow.shutdown.timeout={SHORT:g}s",
                        "--set", "onceflow.kafka.max-poll-records=1",
                        "--set", "onceflow.consumer.max-in-flight-batches=1",
                        "--set", "onceflow.persistence.interval=100ms",
                        "--set", "onceflow.commit.interval=200ms"])
    wait_for_log(worker, run.log, "partitions assigned", timeout=60)
    return worker, produced


def test_sigterm_with_the_store_frozen_exits_in_time_having_committed_only_what_is_stored(
    kafka_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    redis = services.start_redis(tmp_path / "redis")  # private: this test freezes it
    try:
        run = Run(kafka_service, redis, tmp_path, unique_name, partitions=2)
        worker, produced = _busy_worker(run, seed=6)
        services.freeze(redis)  # every store call from now on hangs
        try:
            code = run.sigterm_within(worker)
            offsets = run.committed()
        finally:
            services.thaw(redis)
        assert code != 0 or "stopped: flushed and committed" in run.text(), run.text()[-3000:]
        assert sum(offsets.values()) < produced, offsets
        assert_committed_is_stored(run, offsets, produced)
    finally:
        services.stop(redis)


def test_sigterm_with_the_broker_frozen_mid_processing_exits_in_time(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    kafka = services.start_tansu(tmp_path / "kafka")  # private: this test freezes it
    try:
        run = Run(kafka, redis_service, tmp_path, unique_name, partitions=2)
        worker, produced = _busy_worker(run, seed=7)
        services.freeze(kafka)  # fetches, sends, commits and the group leave hang
        try:
            run.sigterm_within(worker)
        finally:
            services.thaw(kafka)
        offsets = run.committed()
        assert sum(offsets.values()) < produced, offsets
        assert_committed_is_stored(run, offsets, produced)
    finally:
        services.stop(kafka)


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """An address that takes connections and never answers: a broker that hangs (the
    kernel completes the handshake, nothing reads the requests)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"127.0.0.1:{listening.getsockname()[1]}"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_with_the_broker_silent_exits_in_time(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
    silent_broker: str, stop: signal.Signals,
) -> None:
    log = tmp_path / "worker.log"
    # The supervisor blocks inside the core's start (up to the request timeout
    # + 10 s): the old shutdown waited for it, then for the drain.
    worker = start_worker(silent_broker, f"redis://{redis_service.address}/0",
                          unique_name("g"), unique_name("p"), unique_name("robots"), log,
                          ["--set", f"onceflow.shutdown.timeout={SHORT:g}s"])
    try:
        wait_for_log(worker, log, "worker started", timeout=60)
        sent = time.monotonic()
        worker.send_signal(stop)
        code = worker.wait(timeout=SHORT_BOUND)
        assert time.monotonic() - sent < SHORT_BOUND
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit {SHORT_BOUND}s after {stop.name}:\n"
                             f"{log.read_text()[-3000:]}") from None
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    # Past the shutdown timeout: forced (1), having committed nothing (no broker).
    assert code == 1 and "exiting now (1)" in log.read_text(), log.read_text()[-3000:]


def test_a_second_sigterm_exits_at_once(
    redis_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
    silent_broker: str,
) -> None:
    log = tmp_path / "worker.log"
    nowhere = silent_broker
    # A long shutdown timeout: only the second signal can end the worker in time.
    worker = start_worker(nowhere, f"redis://{redis_service.address}/0", unique_name("g"),
                          unique_name("p"), unique_name("robots"), log,
                          ["--set", "onceflow.shutdown.timeout=60s"])
    try:
        wait_for_log(worker, log, "worker started", timeout=60)
        worker.send_signal(signal.SIGTERM)
        wait_for_log(worker, log, "received SIGTERM", timeout=10)
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=5)
        assert time.monotonic() - sent < 5
        assert code == 1 and "second stop signal" in log.read_text(), log.read_text()[-3000:]
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit 5s after a second SIGTERM:\n"
                             f"{log.read_text()[-3000:]}") from None
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
