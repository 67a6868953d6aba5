"""``onceflow chaos``: two worker processes SIGKILLed at random, then every window checked.

The robot pipeline runs as a stateless republisher (raw reports -> one event
per fastening) and a windowed aggregator (per-robot-per-minute counts
feeding per-robot daily counts). While events flow, each process is
SIGKILLed at random moments and restarted, and with ``pauses`` also frozen
(SIGSTOP) for a random while, some longer than the session timeout (its
group moves its partitions on; thawed, it is a zombie until it learns so).
Afterwards every window of both stages (closed ones from history rows, open ones
from current states) is compared with the ground truth recomputed from the input.
The robots re-send a share of their reports (plain JSON, as after a lost
acknowledgement); the republisher must drop exactly those, by ``(serial, seq)``.

Which events are late depends on how the partitions interleave (windows close
on the stage's watermark), so the check reads the late-events topic: every
event of the input is in its window or there, once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from onceflow.devtools import chaos_faults, services
from onceflow.devtools.chaos_report import ChaosReport, report_table
from onceflow.devtools.chaos_truth import (  # the run's ground truth, kept apart
    STAGES,
    expected_windows,
    read_hop,
    read_late,
    stored_windows,
)
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
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, dropped_duplicates
from onceflow.stores.base import StateStore


@dataclass(frozen=True)
class ChaosOptions:
    messages: int = 30_000
    duration: float = 30.0  # seconds over which the input is produced
    kills: int = 10  # in all, split between the two processes
    seed: int = 1
    store: str = "redis"
    partitions: int = 4
    disorder: float = 0.05  # share of results arriving out of order (some too late)
    max_delay_ms: int = 120_000  # how far out of order
    resend: float = 0.02  # share of reports a robot sends twice (dropped by the republisher)
    timeout: float = 300.0
    #: Reports keyed by robot (one raw partition per robot); False: keyed by robot and
    #: sequence (``spread``), so each robot's events reach the aggregator from every root
    #: partition, and a re-sent report lands on its original's partition.
    keyed: bool = True
    republishers: int = 1  # republisher processes (one consumer group)
    aggregators: int = 1  # aggregator processes (one consumer group)
    down: float = 0.0  # seconds a killed process stays down before its restart
    start_ms: int = 0  # event times start that long after midnight
    settings: tuple[tuple[str, str], ...] = ()  # more worker settings (key, value)
    #: A report's events cross the hop as one record (``republish(unit=True)``); False:
    #: one record each (``robot_chain.normalize_per_value``).
    units: bool = True
    #: The republisher drops re-sent reports by ``(serial, seq)`` (a producer dedup table,
    #: in the store); False: a stateless republisher that needs no store (``resend`` 0).
    republisher_dedup: bool = True
    #: Strike a process only while every process of its consumer group is settled (holds
    #: an assignment, no rebalance under way, for ``chaos_faults.SETTLED_S``): no kill
    #: lands in a rebalance or right after one, so a partition's outage is bounded (a
    #: kill, the session timeout, one rejoin), never two outages chained.
    settled_kills: bool = False
    #: SIGSTOPs in all, shared out over the processes as kills are; each freezes its
    #: process for a random while within ``pause_s`` (seconds), then SIGCONT: a process's
    #: pauses alternate between the range's lower half and its upper half (beyond
    #: demo.conf's 6 s session timeout: the group moves its partitions on meanwhile).
    pauses: int = 0
    pause_s: tuple[float, float] = (1.0, 15.0)


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
        self.late_topic, self.dead_topic = f"chaos-late-{run_id}", f"chaos-dlq-{run_id}"
        normalize = ("normalize" if o.units else "normalize_per_value") + (
            "" if o.republisher_dedup else "_without_dedup")
        pipelines = {"republisher": f"onceflow.examples.robot_chain:{normalize}",
                     "aggregator": "onceflow.examples.robot_chain:windows"}
        names = {"aggregator": "aggregator", "republisher": "republisher",
                 **{f"republisher-{n}": "republisher" for n in range(2, o.republishers + 1)},
                 **{f"aggregator-{n}": "aggregator" for n in range(2, o.aggregators + 1)}}
        self.workers = {
            name: WorkerProcess(
                worker_command(packaged_config("demo.conf"), {
                    **store_settings,
                    "onceflow.pipeline": pipelines[role],
                    "onceflow.kafka.bootstrap-servers": bootstrap,
                    "onceflow.kafka.group-id": self.groups[role],
                    "onceflow.kafka.dead-letter-topic": self.dead_topic,
                    "onceflow.kafka.late-events-topic": self.late_topic,
                    "onceflow.kafka.producer.outbox-store": o.store,  # the one store started
                    **dict(o.settings),
                    **worker_settings.get(name, worker_settings.get(role, {})),
                }),
                env, workdir, name)
            for name, role in names.items()
        }
        self.report = ChaosReport(messages=o.messages, groups=dict(self.groups), topics={
            "raw": self.raw, "normalized": self.normalized, "late": self.late_topic,
            "dead": self.dead_topic})

    async def run(self) -> ChaosReport:
        started = time.monotonic()
        o = self.o
        stream = generate(o.messages, seed=o.seed, disorder=o.disorder,
                          max_delay_ms=o.max_delay_ms, resend=o.resend, start_ms=o.start_ms)
        self.report.events, self.report.resends = stream.events, stream.resends
        for topic in (self.raw, self.normalized, self.late_topic, self.dead_topic):
            await create_topic(self.bootstrap, topic, o.partitions)
        for worker in self.workers.values():
            worker.start()
        self.report.timeline["workers started"] = time.time()
        raw_ends: dict[int, int] = {}
        messages = stream.messages if o.keyed else spread(stream.messages)
        producing = asyncio.create_task(
            produce(self.bootstrap, self.raw, messages, o.duration, raw_ends))
        rng = random.Random(o.seed)
        # Kills and pauses shared out over the processes (one more for some if uneven).
        names, n = sorted(self.workers), len(self.workers)
        rng.shuffle(names)
        shares = {name: o.kills // n + (i < o.kills % n) for i, name in enumerate(names)}
        pauses = {name: o.pauses // n + (i < o.pauses % n) for i, name in enumerate(names)}
        say = self.console.print
        def group(name: str) -> list[WorkerProcess]:  # its role's processes, to strike settled
            role = name.startswith("republisher")
            return [w for other, w in self.workers.items()
                    if o.settled_kills and other.startswith("republisher") == role]

        struck = [chaos_faults.kills(name, worker, shares[name], random.Random(rng.random()),
                                     down=o.down, group=group(name), say=say)
                  for name, worker in self.workers.items()]
        frozen = [chaos_faults.pauses(name, worker, pauses[name], random.Random(rng.random()),
                                      within=o.pause_s, say=say)
                  for name, worker in self.workers.items()]
        _, spans = await asyncio.gather(asyncio.gather(*struck), asyncio.gather(*frozen))
        self.report.pauses = {name: s for name, s in zip(self.workers, spans, strict=True) if s}
        await producing
        self.report.timeline["input produced, kills done"] = time.time()
        self.report.caught_up = await self._drain(raw_ends)
        for name, worker in self.workers.items():
            await worker.assigned()
            self.report.exit_codes[name] = worker.terminate(timeout=10)
            self.report.kills[name] = worker.kills
        await self._check(stream)
        self.report.elapsed = time.monotonic() - started
        return self.report

    async def _drain(self, raw_ends: dict[int, int]) -> bool:
        """Republishers done with the input, then aggregator done with all they produced."""
        async with CommittedOffsets(self.bootstrap, self.groups["republisher"]) as rep:
            if not await rep.wait_for(self.raw, raw_ends, self.o.timeout,
                                      self.workers["republisher"]):
                return False
        self.report.timeline["republisher committed"] = time.time()
        normalized_ends = await read_ends(self.bootstrap, self.normalized, self.o.partitions)
        self.report.normalized = sum(normalized_ends.values())
        async with CommittedOffsets(self.bootstrap, self.groups["aggregator"]) as agg:
            done = await agg.wait_for(self.normalized, normalized_ends, self.o.timeout,
                                      self.workers["aggregator"])
        self.report.timeline["aggregator committed"] = time.time()
        return done

    async def _check(self, stream: RobotStream) -> None:
        hop, (late, twice) = await asyncio.gather(  # each reads until quiet: side by side
            read_hop(self.bootstrap, self.normalized, self.o.partitions),
            read_late(self.bootstrap, self.late_topic, self.o.partitions))
        self.report.normalized_once, self.report.normalized_events = hop
        truth, matched = expected_windows(stream, late)
        self.report.late_events = late  # for a caller's own ground truth
        self.report.late = {stage: sum(late.get(stage, Counter()).values()) for stage in STAGES}
        self.report.late_twice = twice + sum(self.report.late.values()) - sum(matched.values())
        if self.o.republisher_dedup:  # else it has no store
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
                self.report.closed[stage] = sum(1 for _ in store.scan_history(stage))
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
        finally:
            store.close()


def spread(messages: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Each report keyed by its robot and sequence: a robot's reports spread over the raw
    partitions, and a re-send, the same report sent again, lands on its original's (as a
    keyed producer's re-sends do): producer-sequence dedup compares them there. (A re-send
    under another key may land elsewhere, where no partition's table has the original;
    docs/guide/reading-topics-and-producer-duplicates.md.)"""
    keyed = []
    for _, value in messages:
        report = parse_report(value)
        keyed.append((f"{report['serial']}:{report['seq']}".encode(), value))
    return keyed


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


def start_store(kind: str, state: Path, namespace: str) -> tuple[ServiceInfo, dict[str, str]]:
    """Start a local Redis or Cassandra and the ``--set`` overrides that point a worker at it."""
    service = (services.start_redis(state / "redis") if kind == "redis"
               else services.start_cassandra(state / "cassandra"))
    return service, store_settings(kind, service, namespace)


def store_settings(kind: str, service: ServiceInfo, namespace: str) -> dict[str, str]:
    """The ``--set`` overrides that point a worker at a running Redis or Cassandra;
    ``namespace`` becomes the Redis key prefix or the Cassandra keyspace."""
    if kind == "redis":
        return {"onceflow.stores.redis.url": f"redis://{service.address}/0",
                "onceflow.stores.redis.key-prefix": namespace}
    return {"onceflow.stores.cassandra.contact-points": service.host,
            "onceflow.stores.cassandra.port": str(service.port),
            "onceflow.stores.cassandra.keyspace": namespace}


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="onceflow chaos", description=__doc__)
    d = ChaosOptions()
    parser.add_argument("--messages", type=int, default=d.messages)
    parser.add_argument("--duration", type=float, default=d.duration,
                        help="seconds over which the input is produced")
    parser.add_argument("--kills", type=int, default=d.kills)
    parser.add_argument("--pauses", type=int, default=d.pauses,
                        help=f"SIGSTOPs in all (each {d.pause_s[0]:g}-{d.pause_s[1]:g} s, "
                        "every second one the longer)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--store", choices=("redis", "cassandra"), default=d.store)
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--per-value", action="store_true",
                        help="republish one record per event (default: one per report, a unit)")
    args = parser.parse_args(argv)
    options = ChaosOptions(messages=args.messages, duration=args.duration, kills=args.kills,
                           pauses=args.pauses,
                           seed=args.seed, store=args.store, units=not args.per_value)
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
