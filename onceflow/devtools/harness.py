"""Drive real worker processes against a real broker: the demo's and chaos's tools.

Worker processes are started, SIGKILLed and restarted; topics are created
and filled with producer acknowledgements as the source of truth for end
offsets (never ListOffsets: docs/architecture.md, "The local broker");
committed offsets are read back through one long-lived consumer. Used by
``onceflow demo``, ``onceflow chaos``, the tests and the benchmarks.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka import TopicPartition as KafkaPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from onceflow import faults
from onceflow.runtime.kafka_security import PLAINTEXT, KafkaSecurity, client_kwargs

ASSIGNED = re.compile(r"partitions assigned: \[\(")
#: A rebalance under way for this member: aiokafka revokes before every assignment.
REVOKING = "Revoking previously assigned partitions"


class WorkerProcess:
    """``onceflow run`` as a child process: started, SIGKILLed, restarted, stopped."""

    def __init__(
        self, argv: list[str], env: Mapping[str, str], log_dir: Path, name: str = "worker"
    ):
        self._argv = argv
        self._env = dict(env)
        self._log_dir = log_dir
        self._name = name
        self.logs: list[Path] = []
        self.kills = 0
        self._proc: subprocess.Popen[bytes] | None = None
        #: The assignment last seen settled (which log, where in it) and when first seen.
        self._settled_seen: tuple[tuple[int, int], float] | None = None

    def start(self) -> None:
        log = self._log_dir / f"{self._name}-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self._proc = subprocess.Popen(fault_aware(self._argv, self._env), env=self._env,
                                          stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()
        self.kills += 1

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` (e.g. SIGSTOP and SIGCONT to freeze and thaw it)."""
        assert self._proc is not None
        self._proc.send_signal(signum)

    def terminate(self, timeout: float) -> int | None:
        """SIGTERM and wait; None if it did not exit in time (then it is killed)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def exited(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def wait(self, timeout: float) -> int | None:
        """Its exit code once it exits by itself within ``timeout``; None if it did not."""
        assert self._proc is not None
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    async def assigned(self, timeout: float = 120.0) -> None:
        """Wait until the current process has been assigned partitions."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ASSIGNED.search(self.logs[-1].read_text(errors="replace")):
                return
            if self.exited() is not None:
                raise RuntimeError(f"{self._name} exited with {self.exited()}; see "
                                   f"{self.logs[-1]}{self.log_tail()}")
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{self._name} got no partitions in {timeout:.0f}s; see "
                           f"{self.logs[-1]}{self.log_tail()}")

    def settled_for(self) -> float | None:
        """Seconds since this harness first saw the current process settled on its latest
        assignment (it holds one and no rebalance is under way: its last rebalance line is
        an assignment, not a revoke); None while it is not settled. A strike right after a
        rebalance would chain the outage of the partitions it just took over onto their
        last one."""
        text = self.logs[-1].read_text(errors="replace")
        starts = [match.start() for match in ASSIGNED.finditer(text)]
        if not starts or text.rfind(REVOKING) >= starts[-1]:
            return None
        seen = (len(self.logs), starts[-1])
        if self._settled_seen is None or self._settled_seen[0] != seen:
            self._settled_seen = (seen, time.monotonic())
        return time.monotonic() - self._settled_seen[1]

    def log_tail(self, lines: int = 40) -> str:
        """The current log's last lines, for a failure message: pytest's temporary
        directories (and the log) may be gone by the time someone reads it."""
        try:
            tail = self.logs[-1].read_text(errors="replace").splitlines()[-lines:]
        except OSError as error:
            return f" (log unreadable: {error})"
        return "\n--- last lines of the log ---\n" + "\n".join(tail)


async def kill_repeatedly(worker: WorkerProcess, times: int, rng: random.Random,
                          gap: tuple[float, float] = (0.3, 2.0)) -> None:
    """Start the worker and SIGKILL it ``times`` times, each a random ``gap`` (seconds)
    after it was assigned partitions, so the kill lands mid-work; then start it for good
    and wait for its assignment."""
    for _ in range(times):
        worker.start()
        await worker.assigned()
        await asyncio.sleep(rng.uniform(*gap))
        worker.kill()
    worker.start()
    await worker.assigned()


def fault_aware(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``argv`` (``python -m onceflow ...``) through the test-only entry point that reads the
    ``ONCEFLOW_FAULT_*`` switches when ``env`` sets one (``onceflow run`` refuses them)."""
    if faults.set_in(env) and list(argv[1:3]) == ["-m", "onceflow"]:
        return [argv[0], "-m", "onceflow.devtools.fault_worker", *argv[3:]]
    return list(argv)


def packaged_config(name: str) -> Path:
    """A HOCON file shipped in ``onceflow.examples`` (e.g. ``demo.conf``)."""
    return Path(str(resources.files("onceflow.examples").joinpath(name)))


def worker_command(config: Path, settings: Mapping[str, str]) -> list[str]:
    """``python -m onceflow run -c config --set key="value" ...`` (numbers, booleans unquoted)."""
    argv = [sys.executable, "-m", "onceflow", "run", "-c", str(config)]
    for key, value in settings.items():
        bare = value.isdigit() or value in ("true", "false")
        argv += ["--set", f"{key}={value}" if bare else f'{key}="{value}"']
    return argv


async def create_topic(bootstrap: str, topic: str, partitions: int,
                       security: KafkaSecurity = PLAINTEXT,
                       configs: dict[str, str] | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs(security))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs or {})])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes]],
                  seconds: float = 0.0, ends: dict[int, int] | None = None,
                  security: KafkaSecurity = PLAINTEXT) -> dict[int, int]:
    """Produce in order, spread over ``seconds``; returns end offsets from the acks.

    ``ends`` (if given) is updated as chunks are acknowledged, so a caller can
    watch progress while this runs.
    """
    ends = {} if ends is None else ends
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=5,
                                **client_kwargs(security))
    await producer.start()
    try:
        chunks = max(1, int(seconds * 10))
        size = max(1, -(-len(messages) // chunks))
        for start in range(0, len(messages), size):
            acks = [await producer.send(topic, value, key=key)
                    for key, value in messages[start:start + size]]
            for meta in await asyncio.gather(*acks):
                ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
            if seconds:
                await asyncio.sleep(0.1)
    finally:
        await producer.stop()
    return ends


class CommittedOffsets:
    """Reads a group's committed offsets through one consumer (no group join)."""

    def __init__(self, bootstrap: str, group: str, security: KafkaSecurity = PLAINTEXT):
        self._bootstrap = bootstrap
        self._group = group
        self._security = security
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> CommittedOffsets:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap,
                                          group_id=self._group, enable_auto_commit=False,
                                          **client_kwargs(self._security))
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._consumer is not None
        await self._consumer.stop()

    async def read(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        assert self._consumer is not None
        return {p: await self._consumer.committed(KafkaPartition(topic, p)) or 0
                for p in partitions}

    async def wait_for(self, topic: str, ends: Mapping[int, int], timeout: float,
                       alive: WorkerProcess | None = None) -> bool:
        """True once every partition's committed offset reached its end offset."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = await self.read(topic, list(ends))
            if all(got[p] >= end for p, end in ends.items()):
                return True
            if alive is not None and alive.exited() is not None:
                raise RuntimeError(f"worker died; see {alive.logs[-1]}")
            await asyncio.sleep(0.25)
        return False


async def read_ends(bootstrap: str, topic: str, partitions: int, quiet: float = 2.0,
                    security: KafkaSecurity = PLAINTEXT) -> dict[int, int]:
    """True end offsets by reading the whole topic until it stays quiet (not ListOffsets)."""
    ends = {p: 0 for p in range(partitions)}
    for record in await read_all(bootstrap, topic, partitions, quiet, security):
        ends[record.partition] = record.offset + 1
    return ends


async def read_all(bootstrap: str, topic: str, partitions: int, quiet: float = 2.0,
                   security: KafkaSecurity = PLAINTEXT) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic``, read from the start until nothing came for ``quiet`` s."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **client_kwargs(security))
    await consumer.start()
    try:
        tps = [KafkaPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        found: list[ConsumerRecord[bytes, bytes]] = []
        last_seen = time.monotonic()
        while time.monotonic() - last_seen < quiet:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                if records:
                    found.extend(records)
                    last_seen = time.monotonic()
        return found
    finally:
        await consumer.stop()
