"""The robot demo: a worker SIGKILLed and restarted mid-stream, then checked.

``run_demo`` is what ``onceflow demo`` shows and what the end-to-end test
asserts on: it produces the synthetic robot stream (plain JSON, with about
2% of the reports re-sent as after a lost acknowledgement) while a worker process
runs, kills it with SIGKILL at random moments (restarting it each time),
waits until the committed offsets reach the produced end offsets (read
from the producer's acknowledgements, never from ListOffsets), stops the
worker with SIGTERM and compares every robot's totals with the ground truth
(each report once), and the re-sends dropped with the re-sends produced. It
ends with ``onceflow reconcile`` of the pipeline (``DemoOptions.reconcile``):
the input replayed with the worker's rules, every stored robot compared.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from onceflow.devtools import services
from onceflow.devtools.harness import (
    CommittedOffsets,
    WorkerProcess,
    create_topic,
    packaged_config,
    produce,
    worker_command,
)
from onceflow.devtools.robot_stream import RobotStream, generate
from onceflow.devtools.tables import measures
from onceflow.reconcile.run import Result
from onceflow.runtime.config import load_settings
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, dropped_duplicates
from onceflow.stages.state import decode_state
from onceflow.stores.redis_store import RedisStore

PIPELINE_ID = "robots"
STAGE_ID = "per_robot"


@dataclass(frozen=True)
class DemoOptions:
    messages: int = 40_000
    robots: int = 1000
    partitions: int = 4
    kills: int = 6
    seed: int = 7
    resend: float = 0.02  # share of reports a robot sends twice, as after a lost ack
    produce_seconds: float = 30.0
    # A kill strikes this long (uniform, seconds) after the (re)started worker
    # was assigned partitions, so it lands while records are being processed.
    min_gap: float = 0.3
    max_gap: float = 3.0
    timeout: float = 300.0
    # Extra worker settings (``--set`` key -> value), e.g. a small state cache.
    settings: Mapping[str, str] = field(default_factory=dict)
    # End with ``onceflow reconcile`` of the pipeline: its input against its stored states.
    reconcile: bool = True


@dataclass
class DemoReport:
    messages: int = 0
    resends: int = 0
    producer_duplicates: int = 0
    events: int = 0
    kills: int = 0
    restarts: int = 0
    replayed: int = 0  # replayed records skipped whole at the source (sequence tables)
    duplicates: int = 0  # replayed events discarded by the states' watermarks
    dead_letters: int = 0
    robots: int = 0
    robots_matching: int = 0
    lost: int = 0
    double: int = 0
    caught_up: bool = False
    final_exit_code: int | None = None
    elapsed: float = 0.0
    logs: list[Path] = field(default_factory=list)
    reconciled: Result | None = field(default=None, repr=False)  # onceflow reconcile's answer

    @property
    def exact(self) -> bool:
        return (self.caught_up and self.lost == 0 and self.double == 0
                and self.producer_duplicates == self.resends
                and self.robots_matching == self.robots and self.final_exit_code == 0
                and (self.reconciled is None or self.reconciled.exit_code == 0))


def redis_settings(bootstrap: str, redis_url: str, group: str, prefix: str) -> dict[str, str]:
    """``--set`` overrides pointing a worker at this broker, group and Redis namespace."""
    return {
        "onceflow.kafka.bootstrap-servers": bootstrap,
        "onceflow.kafka.group-id": group,
        "onceflow.stores.redis.url": redis_url,
        "onceflow.stores.redis.key-prefix": prefix,
    }


def run_demo(options: DemoOptions, *, bootstrap: str, redis_url: str, workdir: Path,
             console: Console | None = None) -> DemoReport:
    demo = _Demo(options, bootstrap, redis_url, workdir, console)
    report = asyncio.run(demo.run())
    if options.reconcile:  # outside the loop: it runs its own
        report.reconciled = demo.reconcile()
    return report


class _Demo:
    def __init__(self, options: DemoOptions, bootstrap: str, redis_url: str, workdir: Path,
                 console: Console | None):
        self.o = options
        self.bootstrap = bootstrap
        self.redis_url = redis_url
        self.console = console or Console(file=open(os.devnull, "w"))  # noqa: SIM115
        run_id = uuid.uuid4().hex[:8]
        self.topic = f"robot-reports-{run_id}"
        self.group = f"demo-{run_id}"
        self.prefix = f"demo-{run_id}"
        env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": self.topic}
        settings = {**redis_settings(bootstrap, redis_url, self.group, self.prefix),
                    **options.settings}
        argv = worker_command(packaged_config("demo.conf"), settings)
        self.worker = WorkerProcess(argv, env, workdir)
        self.report = DemoReport(messages=options.messages)
        self.end_offsets: dict[int, int] = {}
        self.produced_all = asyncio.Event()

    async def run(self) -> DemoReport:
        started = time.monotonic()
        stream = generate(self.o.messages, self.o.robots, self.o.seed, resend=self.o.resend)
        self.report.events, self.report.resends = stream.events, stream.resends
        await create_topic(self.bootstrap, self.topic, self.o.partitions)
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console, transient=False)
        with progress:
            bar = progress.add_task("committed", total=len(stream.messages))
            self.worker.start()
            producing = asyncio.create_task(self._produce(stream))
            await self._kill_and_restart(progress, bar)
            await producing
            self.report.caught_up = await self._wait_caught_up(progress, bar)
            await self.worker.assigned()  # the last restart may still be starting up
        self.report.final_exit_code = self.worker.terminate(timeout=10)
        self._check(stream)
        self.report.elapsed = time.monotonic() - started
        self.report.logs = self.worker.logs
        return self.report

    def reconcile(self) -> Result:
        """``onceflow reconcile`` of the demo's pipeline, with the worker's settings."""
        from onceflow.examples.robots import build
        from onceflow.reconcile.run import reconcile

        settings = {**redis_settings(self.bootstrap, self.redis_url, self.group, self.prefix),
                    **self.o.settings}
        hocon = {key: value if value.isdigit() or value in ("true", "false") else f'"{value}"'
                 for key, value in settings.items()}
        return reconcile(load_settings(packaged_config("demo.conf"), hocon), build(self.topic))

    async def _produce(self, stream: RobotStream) -> None:
        await produce(self.bootstrap, self.topic, stream.messages, self.o.produce_seconds,
                      self.end_offsets)
        self.produced_all.set()

    async def _kill_and_restart(self, progress: Progress, bar: TaskID) -> None:
        rng = random.Random(self.o.seed)
        for n in range(1, self.o.kills + 1):
            await self.worker.assigned()
            await asyncio.sleep(rng.uniform(self.o.min_gap, self.o.max_gap))
            code = self.worker.exited()
            if code is not None:
                log = self.worker.logs[-1]
                raise RuntimeError(f"worker exited by itself with {code}; see {log}")
            self.worker.kill()
            self.report.kills += 1
            self.worker.start()
            self.report.restarts += 1
            progress.update(bar, description=f"committed (kills {n}/{self.o.kills})")

    async def _wait_caught_up(self, progress: Progress, bar: TaskID) -> bool:
        await self.produced_all.wait()
        async with CommittedOffsets(self.bootstrap, self.group) as committed:
            deadline = time.monotonic() + self.o.timeout
            while time.monotonic() < deadline:
                got = await committed.read(self.topic, list(range(self.o.partitions)))
                progress.update(bar, completed=sum(got.values()))
                if all(got[p] >= end for p, end in self.end_offsets.items()):
                    return True
                if self.worker.exited() is not None:
                    raise RuntimeError(f"worker died; see {self.worker.logs[-1]}")
                await asyncio.sleep(0.25)
        return False

    def _check(self, stream: RobotStream) -> None:
        store = RedisStore(self.redis_url, self.prefix, PIPELINE_ID)
        try:
            got = {key: decode_state(value).value for key, value in store.scan(STAGE_ID)}
            stats = store.read_stats()
            self.report.producer_duplicates = dropped_duplicates(
                row for _, row in store.scan(SEQUENCE_STAGE))
        finally:
            store.close()
        self.report.replayed = stats.get("source.duplicates", 0)
        self.report.duplicates = stats.get(f"{STAGE_ID}.duplicates", 0)
        self.report.dead_letters = stats.get("dead_letters", 0)
        self.report.robots = len(stream.truth)
        for robot in set(stream.truth) | set(got):
            truth: Mapping[str, int] = stream.truth.get(robot, {})
            counts = got.get(robot, {})
            for outcome in ("ok", "failed"):
                diff = counts.get(outcome, 0) - truth.get(outcome, 0)
                self.report.lost += max(0, -diff)
                self.report.double += max(0, diff)
            same = all(counts.get(o, 0) == truth.get(o, 0) for o in ("ok", "failed"))
            self.report.robots_matching += robot in stream.truth and same


def report_table(report: DemoReport) -> Table:
    return measures("onceflow demo: robot screw fastening, exactly once", [
        ("reports produced (plain JSON)", f"{report.messages:,}"),
        ("re-sent by the robots / dropped by (serial, seq)",
         f"{report.resends:,} / {report.producer_duplicates:,}"),
        ("fastening events (after flat-map)", f"{report.events:,}"),
        ("worker SIGKILLs / restarts", f"{report.kills} / {report.restarts}"),
        ("replayed records skipped at the source", f"{report.replayed:,}"),
        ("replayed events discarded by the states", f"{report.duplicates:,}"),
        ("dead letters", f"{report.dead_letters:,}"),
        ("robots matching ground truth", f"{report.robots_matching:,} / {report.robots:,}"),
        ("lost", f"{report.lost:,}"),
        ("double", f"{report.double:,}"),
        ("final SIGTERM exit code", str(report.final_exit_code)),
        ("elapsed", f"{report.elapsed:.1f} s"),
        *_reconciled(report.reconciled),
    ])


def _reconciled(result: Result | None) -> list[tuple[str, str]]:
    """The reconcile's row of the demo's table: robots equal of those compared."""
    if result is None:
        return []
    counts = result.counts.get(STAGE_ID, Counter())
    return [("onceflow reconcile: robots equal to the replayed input",
             f"{counts['equal']:,} / {sum(counts.values()):,} (exit {result.exit_code})")]


def cli(argv: list[str]) -> int:
    """``onceflow demo``: embedded broker and Redis, the demo, a verdict."""
    parser = argparse.ArgumentParser(prog="onceflow demo", description=__doc__)
    defaults = DemoOptions()
    parser.add_argument("--messages", type=int, default=defaults.messages)
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--produce-seconds", type=float, default=defaults.produce_seconds)
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where services and logs live (default: a new temp dir)")
    parser.add_argument("--no-analytics", action="store_true",
                        help="skip the windowed run and the Spark analytics at the end")
    args = parser.parse_args(argv)
    options = DemoOptions(messages=args.messages, kills=args.kills, seed=args.seed,
                          produce_seconds=args.produce_seconds)
    console = Console()
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="onceflow-demo-"))
    state.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]onceflow demo[/] state and logs in {state}")
    kafka = services.start_tansu(state / "kafka")
    redis = services.start_redis(state / "redis")
    analytics = None
    try:
        console.print(f"broker {kafka.address}, redis {redis.address}")
        report = run_demo(options, bootstrap=kafka.address,
                          redis_url=f"redis://{redis.address}/0", workdir=state, console=console)
        if report.reconciled is not None:
            from onceflow.reconcile.command import print_result

            console.rule("onceflow reconcile: the stored states against the retained input")
            print_result(report.reconciled, console)
        console.print(report_table(report))
        verdict = "[green]exact: lost 0, double 0[/]" if report.exact else "[red]NOT EXACT[/]"
        console.print(verdict)
        if report.exact and not args.no_analytics:
            from onceflow.devtools.demo_analytics import run_demo_analytics

            analytics = run_demo_analytics(kafka.address, f"redis://{redis.address}/0",
                                           state, console, seed=args.seed)
    finally:
        services.stop(kafka)
        services.stop(redis)
    if analytics is not None:
        console.print(f"[bold]analytics report:[/] {analytics.report}", soft_wrap=True)
        for name, path in analytics.charts.items():
            console.print(f"[bold]chart {name}:[/] {path}", soft_wrap=True)
        console.print(f"tables (Parquet): {analytics.out / 'tables'}", soft_wrap=True)
    return 0 if report.exact else 1
