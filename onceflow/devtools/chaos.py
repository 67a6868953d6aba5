"""``onceflow chaos``: two worker processes SIGKILLed at random, then every window checked.

The robot pipeline runs as a stateless republisher (raw reports -> one event
per fastening) and a windowed aggregator (per-robot-per-minute counts
feeding per-robot daily counts). While events flow, each process is
SIGKILLed at random moments and restarted. Afterwards every window of both
stages (closed ones from the history rows, open ones from the current
states) is compared with the ground truth recomputed from the input alone.
The robots re-send a share of their reports (plain JSON, as after a lost
acknowledgement); the republisher must drop exactly those, by ``(serial, seq)``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from onceflow.devtools import services
from onceflow.devtools.harness import (
    CommittedOffsets,
    WorkerProcess,
    create_topic,
    packaged_config,
    produce,
    read_ends,
    worker_command,
)
from onceflow.devtools.robot_stream import RobotStream, generate, parse_report
from onceflow.devtools.services import ServiceInfo
from onceflow.devtools.tables import measures
from onceflow.examples.robot_chain import (
    DAY_MS,
    DAY_STAGE,
    LATENESS_MS,
    MINUTE_MS,
    MINUTE_STAGE,
)
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, dropped_duplicates
from onceflow.stages.state import decode_state
from onceflow.stores.base import StateStore

Windows = dict[tuple[str, int], Counter[str]]  # (robot, window start) -> ok/failed
STAGES = {MINUTE_STAGE: (MINUTE_MS, LATENESS_MS), DAY_STAGE: (DAY_MS, 0)}


@dataclass(frozen=True)
class ChaosOptions:
    messages: int = 30_000
    duration: float = 30.0  # seconds over which the input is produced
    kills: int = 10  # in all, split between the two processes
    seed: int = 1
    store: str = "redis"
    partitions: int = 4
    disorder: float = 0.05  # share of results arriving out of order (some too late)
    resend: float = 0.02  # share of reports a robot sends twice (dropped by the republisher)
    timeout: float = 300.0


@dataclass
class ChaosReport:
    messages: int = 0
    events: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    resends: int = 0  # reports the robots sent twice
    producer_duplicates: int = 0  # re-sends the republisher dropped (its dedup tables)
    duplicates: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    windows: dict[str, int] = field(default_factory=dict)  # windows checked per stage
    mismatched: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    double: int = 0
    caught_up: bool = False
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    elapsed: float = 0.0  # from the start (stream generation) to the end of the check
    # Wall-clock moments (time.time()) of the run's phases, for benchmarks:
    # workers started, input produced (and kills done), republisher / aggregator committed.
    timeline: dict[str, float] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return (self.caught_up and self.lost == 0 and self.double == 0
                and self.producer_duplicates == self.resends and not any(self.mismatched.values())
                and all(code == 0 for code in self.exit_codes.values()))


def expected_windows(stream: RobotStream) -> tuple[dict[str, Windows], dict[str, int]]:
    """Every window of both stages, and late counts, from the input alone.

    Written independently of ``onceflow.stages.windows`` on purpose: a robot's
    events in produce order; a window closes once the robot's highest event
    time reaches its end plus the allowed lateness; later events for it are
    late and go no further (the daily stage never sees them). A re-sent
    report (a ``(serial, seq)`` seen before) goes nowhere.
    """
    windows: dict[str, Windows] = {stage: {} for stage in STAGES}
    late: Counter[str] = Counter()
    max_ts: dict[tuple[str, str], int] = {}
    reports: set[tuple[str, int]] = set()
    for _, value in stream.messages:
        report = parse_report(value)
        robot = report["serial"]
        if (robot, report["seq"]) in reports:
            continue
        reports.add((robot, report["seq"]))
        for result in report["results"]:
            outcome, ts = ("ok" if result["ok"] else "failed"), result["ts"]
            for stage, (size, lateness) in STAGES.items():
                start = ts - ts % size
                seen = max_ts.get((stage, robot))
                if seen is not None and start + size + lateness <= seen:
                    late[stage] += 1
                    break  # a late event reaches no later stage
                windows[stage].setdefault((robot, start), Counter())[outcome] += 1
                max_ts[(stage, robot)] = ts if seen is None else max(seen, ts)
    return windows, dict(late)


def stored_windows(store: StateStore, stage: str) -> tuple[Windows, int]:
    """Closed windows from history plus open ones from current states; and overlaps."""
    found: Windows = {}
    overlaps = 0
    for robot, start, value in store.scan_history(stage):
        found[(robot, start)] = Counter(json.loads(value))
    for robot, encoded in store.scan(stage):
        for start, counts in decode_state(encoded).value["open"].items():
            overlaps += (robot, int(start)) in found
            found[(robot, int(start))] = Counter(counts)
    return found, overlaps


class _Chaos:
    def __init__(self, o: ChaosOptions, bootstrap: str, store_settings: Mapping[str, str],
                 open_store: StoreOpener, workdir: Path, console: Console,
                 worker_settings: Mapping[str, Mapping[str, str]]):
        self.o = o
        self.bootstrap = bootstrap
        self.console = console
        self.open_store = open_store
        run_id = uuid.uuid4().hex[:8]
        self.raw, self.normalized = f"chaos-raw-{run_id}", f"chaos-norm-{run_id}"
        self.groups = {"republisher": f"chaos-rep-{run_id}", "aggregator": f"chaos-agg-{run_id}"}
        env = {**os.environ, "ONCEFLOW_CHAIN_RAW_TOPIC": self.raw,
               "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": self.normalized,
               "ONCEFLOW_ROBOTS_STORE": o.store}
        pipelines = {"republisher": "onceflow.examples.robot_chain:normalize",
                     "aggregator": "onceflow.examples.robot_chain:windows"}
        self.workers = {
            name: WorkerProcess(
                worker_command(packaged_config("demo.conf"), {
                    **store_settings,
                    "onceflow.pipeline": pipelines[name],
                    "onceflow.kafka.bootstrap-servers": bootstrap,
                    "onceflow.kafka.group-id": self.groups[name],
                    "onceflow.kafka.dead-letter-topic": f"chaos-dlq-{run_id}",
                    "onceflow.kafka.producer.outbox-store": o.store,  # the one store started
                    **worker_settings.get(name, {}),
                }),
                env, workdir, name)
            for name in pipelines
        }
        self.report = ChaosReport(messages=o.messages)

    async def run(self) -> ChaosReport:
        started = time.monotonic()
        stream = generate(self.o.messages, seed=self.o.seed, disorder=self.o.disorder,
                          resend=self.o.resend)
        self.report.events, self.report.resends = stream.events, stream.resends
        for topic in (self.raw, self.normalized):
            await create_topic(self.bootstrap, topic, self.o.partitions)
        for worker in self.workers.values():
            worker.start()
        self.report.timeline["workers started"] = time.time()
        raw_ends: dict[int, int] = {}
        producing = asyncio.create_task(
            produce(self.bootstrap, self.raw, stream.messages, self.o.duration, raw_ends))
        rng = random.Random(self.o.seed)
        # Each process gets half the kills (one more for a random one if odd),
        # struck at its own random moments.
        names = sorted(self.workers)
        rng.shuffle(names)
        shares = {name: self.o.kills // 2 + (i < self.o.kills % 2) for i, name in enumerate(names)}
        await asyncio.gather(*(self._kill_loop(name, shares[name], rng.random())
                               for name in self.workers))
        await producing
        self.report.timeline["input produced, kills done"] = time.time()
        self.report.caught_up = await self._drain(raw_ends)
        for name, worker in self.workers.items():
            await worker.assigned()
            self.report.exit_codes[name] = worker.terminate(timeout=10)
            self.report.kills[name] = worker.kills
        self._check(stream)
        self.report.elapsed = time.monotonic() - started
        return self.report

    async def _kill_loop(self, name: str, kills: int, seed: float) -> None:
        rng, worker = random.Random(seed), self.workers[name]
        for n in range(kills):
            await worker.assigned()
            await asyncio.sleep(rng.uniform(0.3, 3.0))
            if worker.exited() is not None:
                raise RuntimeError(f"{name} exited by itself; see {worker.logs[-1]}")
            worker.kill()
            worker.start()
            self.console.print(f"  SIGKILL {name} ({n + 1}/{kills})")

    async def _drain(self, raw_ends: dict[int, int]) -> bool:
        """Republisher done with the input, then aggregator done with all it produced."""
        async with CommittedOffsets(self.bootstrap, self.groups["republisher"]) as rep:
            if not await rep.wait_for(self.raw, raw_ends, self.o.timeout,
                                      self.workers["republisher"]):
                return False
        self.report.timeline["republisher committed"] = time.time()
        normalized_ends = await read_ends(self.bootstrap, self.normalized, self.o.partitions)
        async with CommittedOffsets(self.bootstrap, self.groups["aggregator"]) as agg:
            done = await agg.wait_for(self.normalized, normalized_ends, self.o.timeout,
                                      self.workers["aggregator"])
        self.report.timeline["aggregator committed"] = time.time()
        return done

    def _check(self, stream: RobotStream) -> None:
        truth, _ = expected_windows(stream)
        republisher = self.open_store("robots-normalize")
        try:
            self.report.producer_duplicates = dropped_duplicates(
                row for _, row in republisher.scan(SEQUENCE_STAGE))
        finally:
            republisher.close()
        store = self.open_store("robots-windows")
        try:
            stats = store.read_stats()
            for stage in STAGES:
                found, overlaps = stored_windows(store, stage)
                self.report.windows[stage] = len(truth[stage])
                mismatched = overlaps
                for slot in set(truth[stage]) | set(found):
                    want, got = truth[stage].get(slot, Counter()), found.get(slot, Counter())
                    for outcome in ("ok", "failed"):
                        diff = got[outcome] - want[outcome]
                        self.report.lost += max(0, -diff)
                        self.report.double += max(0, diff)
                    mismatched += want != got
                self.report.mismatched[stage] = mismatched
                self.report.duplicates[stage] = stats.get(f"{stage}.duplicates", 0)
                self.report.late[stage] = stats.get(f"{stage}.late", 0)
        finally:
            store.close()


class StoreOpener:
    """Opens the chaos run's store for a pipeline id (Redis or Cassandra)."""

    def __init__(self, store: str, settings: Mapping[str, str]):
        self.store = store
        self.settings = settings

    def __call__(self, pipeline_id: str) -> StateStore:
        s = self.settings
        if self.store == "redis":
            from onceflow.stores.redis_store import RedisStore

            return RedisStore(s["onceflow.stores.redis.url"],
                              s["onceflow.stores.redis.key-prefix"], pipeline_id)
        from onceflow.stores.cassandra_store import CassandraStore

        return CassandraStore([s["onceflow.stores.cassandra.contact-points"]], pipeline_id,
                              port=int(s["onceflow.stores.cassandra.port"]),
                              keyspace=s["onceflow.stores.cassandra.keyspace"],
                              protocol_version=3)


def run_chaos(options: ChaosOptions, *, bootstrap: str, store_settings: Mapping[str, str],
              workdir: Path, console: Console | None = None,
              worker_settings: Mapping[str, Mapping[str, str]] | None = None) -> ChaosReport:
    """``worker_settings``: extra ``--set`` overrides per process ("republisher",
    "aggregator"), e.g. a benchmark's metrics ports."""
    console = console or Console(file=open(os.devnull, "w"))  # noqa: SIM115
    opener = StoreOpener(options.store, store_settings)
    chaos = _Chaos(options, bootstrap, store_settings, opener, workdir, console,
                   worker_settings or {})
    return asyncio.run(chaos.run())


def report_table(report: ChaosReport) -> Table:
    return measures("onceflow chaos: republisher + windowed aggregator under SIGKILL", [
        ("reports produced (without re-sends)", f"{report.messages:,}"),
        ("fastening events", f"{report.events:,}"),
        ("re-sent reports / dropped by (serial, seq)",
         f"{report.resends:,} / {report.producer_duplicates:,}"),
        *[(f"SIGKILLs: {name}", str(n)) for name, n in report.kills.items()],
        *[(f"duplicates discarded: {s}", f"{n:,}") for s, n in report.duplicates.items()],
        *[(f"late events routed: {s}", f"{n:,}") for s, n in report.late.items()],
        *[(f"windows checked: {s}", f"{n:,}") for s, n in report.windows.items()],
        *[(f"windows wrong: {s}", str(n)) for s, n in report.mismatched.items()],
        ("lost", f"{report.lost:,}"),
        ("double", f"{report.double:,}"),
        ("exit codes after SIGTERM", str(report.exit_codes)),
        ("elapsed", f"{report.elapsed:.1f} s"),
    ])


def start_store(kind: str, state: Path, namespace: str) -> tuple[ServiceInfo, dict[str, str]]:
    """Start a local Redis or Cassandra and the ``--set`` overrides that point a worker at it.

    ``namespace`` becomes the Redis key prefix or the Cassandra keyspace.
    """
    if kind == "redis":
        redis = services.start_redis(state / "redis")
        return redis, {"onceflow.stores.redis.url": f"redis://{redis.address}/0",
                       "onceflow.stores.redis.key-prefix": namespace}
    cassandra = services.start_cassandra(state / "cassandra")
    return cassandra, {"onceflow.stores.cassandra.contact-points": cassandra.host,
                       "onceflow.stores.cassandra.port": str(cassandra.port),
                       "onceflow.stores.cassandra.keyspace": namespace}


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="onceflow chaos", description=__doc__)
    d = ChaosOptions()
    parser.add_argument("--messages", type=int, default=d.messages)
    parser.add_argument("--duration", type=float, default=d.duration,
                        help="seconds over which the input is produced")
    parser.add_argument("--kills", type=int, default=d.kills)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--store", choices=("redis", "cassandra"), default=d.store)
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    options = ChaosOptions(messages=args.messages, duration=args.duration, kills=args.kills,
                           seed=args.seed, store=args.store)
    console = Console()
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="onceflow-chaos-"))
    console.print(f"[bold]onceflow chaos[/] state and logs in {state}")
    started = [services.start_tansu(state / "kafka")]
    try:
        store, settings = start_store(args.store, state, f"chaos{time.time_ns()}")
        started.append(store)
        report = run_chaos(options, bootstrap=started[0].address, store_settings=settings,
                           workdir=state, console=console)
    finally:
        for info in started:
            services.stop(info)
    console.print(report_table(report))
    console.print("[green]exact: no drift[/]" if report.exact else "[red]DRIFT[/]")
    return 0 if report.exact else 1
