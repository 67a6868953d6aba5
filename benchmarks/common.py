"""Shared pieces of the benchmarks: worker processes, RSS sampling, progress, reporting.

End offsets come from the producer's acknowledgements and progress from the
group's committed offsets, never from ListOffsets (Tansu gets it wrong for
multi-record batches). Workers are real ``onceflow run`` processes; their
rates start at their "partitions assigned" log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psutil  # type: ignore[import-untyped]
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from onceflow.actors.loop import EventLoopThread
from onceflow.devtools.harness import packaged_config, worker_command
from onceflow.kafka.producer import key_partition

HERE = Path(__file__).resolve().parent
#: Where runs are recorded: a page per day (UTC). RESULTS.md's table of current figures is
#: kept by hand from these pages (see journal/README.md).
JOURNAL = HERE / "journal"
T = TypeVar("T")
ASSIGNED = re.compile(r"^(\S+ \S+) INFO onceflow\.\S+: partitions assigned: (.*)$", re.M)


def assignments_in(text: str) -> list[tuple[float, list[int]]]:
    """A worker log's "partitions assigned" lines: wall-clock time, partition numbers (any
    onceflow logger: the line moved from ``onceflow.actors`` to ``onceflow.kafka``)."""
    return [(datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp(),
             [int(p) for p in re.findall(r", (\d+)\)", m[2])]) for m in ASSIGNED.finditer(text)]


def worker_path(env: Mapping[str, str]) -> str:
    """A worker's PYTHONPATH: this directory (it imports ``bench_pipelines`` from here), then
    ``BENCH_WORKER_TREE`` if set (another checkout, e.g. a commit before a change, built as
    ``make setup`` builds: these scripts measure its workers beside the same baseline),
    else the caller's PYTHONPATH."""
    tree = env.get("BENCH_WORKER_TREE") or env.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(HERE), tree) if p)


def worker_cwd(env: Mapping[str, str]) -> str | None:
    """A worker's working directory: ``BENCH_WORKER_TREE`` if set. ``python -m onceflow``
    puts its working directory first on ``sys.path``, before PYTHONPATH, so a worker started
    from this checkout would import this checkout's onceflow, whatever the tree."""
    return env.get("BENCH_WORKER_TREE") or None


class Worker:
    """One ``onceflow run`` process started with demo.conf plus ``settings``."""

    def __init__(self, settings: Mapping[str, str], env: Mapping[str, str], log: Path,
                 extra: Iterable[str] = ()):
        self.log = log
        argv = [*worker_command(packaged_config("demo.conf"), settings), *extra]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, env={**env, "PYTHONPATH": worker_path(env)},
                                         cwd=worker_cwd(env), stdout=out,
                                         stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def assignments(self) -> list[tuple[float, list[int]]]:
        """The worker's "partitions assigned" lines: wall-clock time, partition numbers."""
        return assignments_in(self.log.read_text(errors="replace"))

    def last_line(self, prefix: str) -> str:
        """The last log line containing ``prefix`` (e.g. "state cache"), or ""."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if prefix in ln]
        return lines[-1] if lines else ""


class RssSampler:
    """Samples the summed RSS of some processes on a thread; keeps the peak."""

    def __init__(self, pids: Iterable[int], every: float = 0.05):
        self._procs = [psutil.Process(pid) for pid in pids]
        self._every = every
        self._stop = threading.Event()
        self.peak = self.last = 0
        self.peaks = [0] * len(self._procs)
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for n, proc in enumerate(self._procs):
                with contextlib.suppress(psutil.NoSuchProcess):
                    rss = proc.memory_info().rss
                    self.peaks[n] = max(self.peaks[n], rss)
                    total += rss
            self.last = total
            self.peak = max(self.peak, total)
            self._stop.wait(self._every)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class CommitWatcher:
    """One long-lived consumer reading a group's committed offsets on its own loop."""

    def __init__(self, bootstrap: str, group: str, topic: str, ends: Mapping[int, int]):
        self._io = EventLoopThread("bench-watch")
        self._ends = dict(ends)
        self._tps = [TopicPartition(topic, p) for p in ends]
        self.reached: dict[int, float] = {}  # partition: wall-clock time it was all committed
        self._consumer = self._io.run(self._open(bootstrap, group))

    @staticmethod
    async def _open(bootstrap: str, group: str) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                    enable_auto_commit=False)
        await consumer.start()
        return consumer

    async def _read(self) -> int:
        total = 0
        for tp in self._tps:
            offset: int = await self._consumer.committed(tp) or 0
            end = self._ends[tp.partition]
            if offset >= end:
                self.reached.setdefault(tp.partition, time.time())
            total += min(offset, end)
        return total

    def committed(self) -> int:
        """Input records committed so far (summed over the partitions)."""
        return self._io.run(self._read())

    def wait(self, workers: list[Worker], timeout: float,
             on_progress: Callable[[int], None] = lambda _: None) -> float:
        """Poll until every input is committed; the wall-clock time it was seen."""
        total = sum(self._ends.values())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.committed()
            on_progress(done)
            if done >= total:
                return time.time()
            dead = [w for w in workers if not w.alive()]
            if dead:
                raise RuntimeError(f"worker exited {dead[0].proc.returncode}; see {dead[0].log}")
            time.sleep(0.05)
        raise RuntimeError(f"not all committed in {timeout:.0f}s; see {workers[0].log}")

    def close(self) -> None:
        self._io.run(self._consumer.stop())
        self._io.stop()


async def raw_consume(bootstrap: str, topic: str, expected: int,
                      handle: Callable[[list[Any]], int]) -> dict[str, float]:
    """The raw baselines' loop: aiokafka getmany until ``expected`` records, each fetched
    batch given to ``handle`` (which answers the events it held); records, events and the
    seconds from the first fetch. Per batch, so the baseline pays no call per record."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                group_id=f"raw-{time.monotonic_ns()}",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=6000, heartbeat_interval_ms=2000,
                                max_poll_records=2000)
    await consumer.start()
    seen = events = 0
    first = 0.0
    try:
        while seen < expected:
            for records in (await consumer.getmany(timeout_ms=500, max_records=2000)).values():
                if not first:
                    first = time.monotonic()
                events += handle(records)
                seen += len(records)
        return {"records": seen, "events": events, "seconds": time.monotonic() - first}
    finally:
        await consumer.stop()


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Lists of ``size`` items (the last one shorter), drawn lazily."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


async def produce_chunks(bootstrap: str, topic: str,
                         chunks: Iterable[list[tuple[bytes | None, bytes]]]) -> dict[int, int]:
    """Produce chunk by chunk (never the whole input in memory); end offsets from the acks."""
    ends: dict[int, int] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=20, max_batch_size=262_144)
    await producer.start()
    try:
        for chunk in chunks:
            acks = [await producer.send(topic, value, key=key) for key, value in chunk]
            for meta in await asyncio.gather(*acks):
                ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    finally:
        await producer.stop()
    return ends


async def count_records(bootstrap: str, topic: str, partitions: int, quiet: float = 1.0) -> int:
    """Records in ``topic``, read from the start until nothing came for ``quiet`` s."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=4 << 20)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        count, last_seen = 0, time.monotonic()
        while time.monotonic() - last_seen < quiet:
            for records in (await consumer.getmany(timeout_ms=200, max_records=10_000)).values():
                if records:
                    count += len(records)
                    last_seen = time.monotonic()
        return count
    finally:
        await consumer.stop()


def machine() -> str:
    """Cores, RAM and Python version, for a section's "Machine:" line."""
    ram = psutil.virtual_memory().total / 2**30
    return (f"{os.cpu_count()} cores, {ram:.0f} GB RAM, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def journal_page() -> Path:
    """Today's journal page (UTC), the default ``--out`` of the benchmarks that record runs."""
    return JOURNAL / f"{datetime.now(UTC):%Y-%m-%d}.md"


def append(out: Path, section: str) -> None:
    """Append one section to a results file (a journal page is created with its title)."""
    if out.exists():
        previous = out.read_text()
    elif out.parent == JOURNAL:
        previous = (f"# Benchmark journal, {out.stem}\n\nRuns and notes of this day (UTC), in the "
                    "order they were added. How to read them: [README.md](README.md).\n")
    else:
        previous = "# Benchmark results\n"
    out.write_text(previous.rstrip() + "\n\n" + section)


async def send_batches(producer: AIOKafkaProducer, topic: str, partition: int,
                       outputs: list[tuple[bytes, bytes]], headers: list[tuple[str, bytes]]
                       ) -> list[asyncio.Future[Any]]:
    """A partition's outputs in as few batches as hold them (``send_batch``, as onceflow's
    producer sends): each batch's ack future."""
    acks = []
    batch = producer.create_batch()
    for key, value in outputs:
        if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            acks.append(await producer.send_batch(batch, topic, partition=partition))
            batch = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                raise ValueError(f"a record of {len(value)} bytes fits no batch")
    acks.append(await producer.send_batch(batch, topic, partition=partition))
    return acks


async def raw_republish(bootstrap: str, topic: str, output: str, expected: int,
                        same_partition: bool, batched: bool = False) -> dict[str, float]:
    """The hand-written at-least-once republisher the republish benchmarks compare with.

    Consume a batch, produce each input ``{"id", "parts"}`` as ``parts`` records
    ``{"id", "part"}`` keyed like the input (to the input's partition number if
    ``same_partition``), await the sends, commit. Rate from the first record.
    ``batched``: send as onceflow's producer does (``send_batches``), not one ``send``
    per record.
    """
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                group_id=f"raw-{time.monotonic_ns()}",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=6000, heartbeat_interval_ms=2000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                max_batch_size=1_048_576 if batched else 16_384)
    await consumer.start()
    await producer.start()
    partitions = sorted(await producer.partitions_for(output))
    seen, first = 0, 0.0
    try:
        while seen < expected:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            if batches and not first:
                first = time.monotonic()
            sends: list[asyncio.Future[Any]] = []
            lanes: dict[int, list[tuple[bytes, bytes]]] = {}  # batched: partition -> outputs
            for tp, records in batches.items():
                partition = tp.partition if same_partition else None
                for record in records:
                    item = json.loads(record.value or b"")
                    key = record.key or b""
                    for part in range(int(item["parts"])):
                        value = json.dumps({"id": item["id"], "part": part},
                                           separators=(",", ":")).encode()
                        if batched:
                            lane = partition if partition is not None else \
                                key_partition(key, partitions)
                            lanes.setdefault(lane, []).append((key, value))
                            continue
                        sends.append(await producer.send(output, value, key=record.key,
                                                         partition=partition))
                seen += len(records)
            for lane, outputs in lanes.items():
                sends.extend(await send_batches(producer, output, lane, outputs, []))
            await asyncio.gather(*sends)
            if batches:
                await consumer.commit()
        return {"records": seen, "seconds": time.monotonic() - first}
    finally:
        await producer.stop()
        await consumer.stop()

