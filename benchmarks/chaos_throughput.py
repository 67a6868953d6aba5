"""Throughput of the two-process chaos run beside the raw consume ceiling, same run.

The raw ceiling: a plain aiokafka getmany + decode loop over the same input
(``throughput.raw_child``), in its own process. The chaos run: ``onceflow
chaos`` (republisher flat-mapping reports 1 -> ~3 into a topic, windowed
aggregator with two tumbling stages) with all input produced up front
(``--duration 0``), the two processes SIGKILLed ``--kills`` times in all.

Three ratios, each on one footing for both sides (and a second baseline):

- **steady state**: input records over the time from the aggregator's first
  processed record to its last (the chain's first and last output; both
  workers' record counters are read from their ``/metrics`` every 100 ms),
  beside the raw loop's records/s from its first record to its last (the
  median of ``--raw-repeat`` passes: one pass lasts about half a second);
- **hand-written chain**, on the steady-state footing: the same topology
  written by hand at least once (``raw_chain.py``: two processes, one
  record per report between them, in-memory windows; no dedup, no state
  store, no lateness), run before the onceflow chain on the same input;
  input records over its aggregator's first to last record, beside the raw
  loop, and the onceflow chain's steady rate as a fraction of it;
- **end to end**: input records over the time from the start of both
  worker processes until the aggregator's last commit (seen in its
  ``/metrics``; process starts, group joins, the persistence and commit
  intervals included, the harness's detection of the end not), beside the
  raw child process's whole life (start, group join, consume, stop); with
  kills, until the harness saw the aggregator's commits reach the end;
- **whole run** (the figure of earlier sections): input records over the
  chaos run's wall time, from generating the stream to the end of the
  check, shutdown included.

Without kills it also says where the host's CPU went in the steady state
(psutil, read with the counters): how busy the cores were, each worker's,
the broker's and the store's share of a core, and each worker's CPU per
record it processed between its own first and last record.

With ``--repeat N`` the whole measurement (raw passes, both hand-written chains,
the onceflow chain) runs N rounds, one after another on the same broker and
store: a single round moves by 15-25% with the host, so a claim rests on the
rounds' medians (the section has every round's figures and the median round in
full).

With ``BENCH_WORKER_TREE=<tree>`` (another checkout, compiled as ``make setup`` compiles
it) the chain's workers run that tree's code beside the same baselines, as in
``throughput.py``; ``--cpu WORKER=CPU`` sets one worker's ``onceflow.cpu``.

    python benchmarks/chaos_throughput.py [--messages 30000] [--kills 10] [--store redis]
        [--persistence-interval 500ms] [--commit-interval 2s] [--raw-repeat 3]
        [--repeat 1] [--cpu WORKER=CPU ...] [--out journal/<date>.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from common import append, assignments_in, journal_page, worker_path
from raw_chain import WIRES, measure_chain
from throughput import PARTITIONS, measure_raw

from onceflow.devtools import harness, services
from onceflow.devtools.chaos import (
    ChaosOptions,
    ChaosReport,
    run_chaos,
    start_store,
    store_settings,
)
from onceflow.devtools.robot_stream import generate

NAMES = ("republisher", "aggregator")
RECORDS = re.compile(rb"^onceflow_records_total(?:\{[^}]*\})? (\S+)$", re.MULTILINE)
COMMITTED = re.compile(rb"^onceflow_committed_offset\{[^}]*\} (\S+)$", re.MULTILINE)
#: Only those two (``name[]``): the probe reads them every 0.1 s, and rendering every
#: family each time cost each worker about 5% of its CPU (py-spy, journal 2026-11-29).
ASKED = "/metrics?name[]=onceflow_records_total&name[]=onceflow_committed_offset"


class Probe(threading.Thread):
    """Reads each worker's records counter and committed offsets every ``interval`` s:
    (wall time, records processed, sum of committed offsets) samples."""

    def __init__(self, ports: dict[str, int], services_pids: dict[str, int],
                 interval: float = 0.1):
        super().__init__(daemon=True)
        self.ports, self.interval = ports, interval
        self.samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ports}
        self.done = threading.Event()
        self.cpu: dict[str, float] = {}  # CPU seconds (user + system) of the first incarnation
        self._procs: dict[str, psutil.Process] = {}
        for name, pid in services_pids.items():
            self._procs[name] = psutil.Process(pid)
        # (wall time, CPU seconds) per worker and service; the host's (wall time, busy s)
        self.cpu_samples: dict[str, list[tuple[float, float]]] = {
            name: [] for name in (*ports, *services_pids)}
        self.host: list[tuple[float, float]] = []

    def _cpu(self, name: str, port: int) -> None:
        proc = self._procs.get(name)
        if proc is None:
            mark = f"onceflow.metrics.port={port}"
            found = [p for p in psutil.Process().children(recursive=True)
                     if mark in " ".join(p.cmdline())]
            if not found:
                return
            proc = self._procs[name] = found[0]
        try:
            times = proc.cpu_times()
            used = times.user + times.system
            if name not in self.ports:  # a service: its children too (Cassandra's JVM)
                used += sum(child.cpu_times().user + child.cpu_times().system
                            for child in proc.children(recursive=True))
        except psutil.Error:
            return  # exited: the last reading stays
        self.cpu[name] = used
        self.cpu_samples[name].append((time.time(), self.cpu[name]))

    def run(self) -> None:
        while not self.done.is_set():
            host = psutil.cpu_times()
            self.host.append((time.time(), host.user + host.nice + host.system + host.irq
                              + host.softirq + host.steal))
            for name in self.cpu_samples:
                if name not in self.ports:
                    self._cpu(name, 0)
            for name, port in self.ports.items():
                self._cpu(name, port)
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{ASKED}",
                                                timeout=1) as answer:
                        text = answer.read()
                except OSError:
                    continue  # not up yet, or stopping
                found = RECORDS.search(text)
                committed = sum(float(n) for n in COMMITTED.findall(text))
                if found:
                    self.samples[name].append((time.time(), float(found[1]), committed))
            self.done.wait(self.interval)

    def members(self, name: str) -> list[str]:
        """The workers of a role: ``aggregator``, and ``aggregator-2``... with
        ``--aggregators``."""
        return [worker for worker in self.samples
                if worker == name or worker.startswith(f"{name}-")]

    def first_and_last(self, name: str) -> tuple[float, float, float]:
        """When the role's workers had processed their first record, when their last; how
        many."""
        spans = [self._first_and_last(worker) for worker in self.members(name)]
        return (min(first for first, _, _ in spans), max(last for _, last, _ in spans),
                sum(final for _, _, final in spans))

    def _first_and_last(self, worker: str) -> tuple[float, float, float]:
        samples = self.samples[worker]
        final = max((n for _, n, _ in samples), default=0.0)
        first = next(t for t, n, _ in samples if n > 0)
        last = next(t for t, n, _ in samples if n >= final)
        return first, last, final

    def steady_us(self, name: str) -> tuple[float, float]:
        """The role's CPU per record its workers processed, each between its own first and
        last record; and how many records that was."""
        cpu = done = 0.0
        for worker in self.members(name):
            start, end, _ = self._first_and_last(worker)
            records = [n for t, n, _ in self.samples[worker] if start <= t <= end]
            if records:
                done += max(records) - min(records)
                cpu += self.cpu_between(self.cpu_samples[worker], start, end)
        return (cpu / done * 1e6 if done > 0 else float("nan")), done

    def cpu_of(self, name: str) -> float:
        """CPU seconds of the role's workers (their first incarnations)."""
        return sum(self.cpu.get(worker, 0.0) for worker in self.members(name))

    def cpu_between(self, series: list[tuple[float, float]], start: float, end: float
                    ) -> float:
        """CPU seconds of a series between its last readings at or before ``start`` and
        ``end`` (read every ``interval``: the window's edges are that coarse)."""
        def at(moment: float) -> float:
            return max(((t, c) for t, c in series if t <= moment), default=(0.0, 0.0))[1]
        return at(end) - at(start)

    def committed_at(self, name: str) -> float:
        """When the role's committed offsets reached their final values (its last commit)."""
        moments = []
        for worker in self.members(name):
            samples = self.samples[worker]
            final = max(c for _, _, c in samples)
            moments.append(next(t for t, _, c in samples if c >= final))
        return max(moments)


def assigned_at(log: Path) -> float:
    """Wall time of the worker's first "partitions assigned" log line."""
    found = assignments_in(log.read_text(errors="replace"))
    assert found, f"no assignment in {log}"
    return found[0][0]


def timeline_rows(report: ChaosReport, probe: Probe, workdir: Path) -> list[str]:
    """The harness's moments, and without kills each worker's (one incarnation each)."""
    t0 = report.timeline["workers started"]
    moments: list[tuple[str, float]] = []
    for name in NAMES if not any(report.kills.values()) else ():
        first, last, final = probe.first_and_last(name)
        moments += [(f"{name}: partitions assigned", assigned_at(workdir / f"{name}-0.log")),
                    (f"{name}: first record processed", first),
                    (f"{name}: last record processed ({final:,.0f} records)", last),
                    (f"{name}: last commit", probe.committed_at(name))]
    moments += [(f"harness: {k}", v) for k, v in report.timeline.items() if k != "workers started"]
    return [f"| {label} | {at - t0:.2f} |" for label, at in sorted(moments, key=lambda m: m[1])]


def steady_cpu_lines(probe: Probe, first: float, last: float) -> list[str]:
    """Where the host's CPU went while the chain ran steadily (the aggregator's first to
    last record): each process's share of a core, and each worker's CPU per record it
    processed between its own first and last record."""
    span = last - first
    cores = os.cpu_count() or 1
    busy = probe.cpu_between(probe.host, first, last)
    used = {name: probe.cpu_between(series, first, last)
            for name, series in probe.cpu_samples.items()}
    own = []
    for name in NAMES:
        start, end, _ = probe.first_and_last(name)
        us, done = probe.steady_us(name)
        if done > 0:
            own.append(f"{name} {us:.1f} us per record it processed "
                       f"({done:,.0f} records, {end - start:.2f} s)")
    return [
        f"Steady state ({span:.2f} s, the aggregator's first to last record, read every "
        f"{probe.interval:.1f} s): the host's {cores} cores were "
        f"{busy / (span * cores):.0%} busy; cores used: "
        + ", ".join(f"{name} {cpu / span:.2f}" for name, cpu in used.items())
        + f", the rest of the host {max(busy - sum(used.values()), 0.0) / span:.2f}. "
        "CPU per record in steady state (the counters of records processed move with "
        "each batch): " + ", ".join(own) + ".",
        "",
    ]


def hand_lines(name: str, hand: dict[str, dict[str, Any]], events: int, messages: int
               ) -> str:
    """A hand-written chain's CPU (whole and steady) and moments, as a paragraph."""
    return (
        f"The {name}'s processes (user + system, start-up included): "
        + ", ".join(f"{role} {hand[role]['cpu']:.2f} s "
                    f"({hand[role]['cpu'] / messages * 1e6:.1f} us per input record)"
                    for role in NAMES)
        + "; between each one's first and last record: "
        + ", ".join(f"{role} {steady_us(hand[role]):.1f} us per record" for role in NAMES)
        + f"; its aggregator folded {hand['aggregator']['events']:,} events "
        f"(the stream holds {events:,}). Its moments, s after both were started: "
        + ", ".join(f"{role} first record {hand[role]['first'] - hand['started']['at']:.2f}, "
                    f"last {hand[role]['last'] - hand['started']['at']:.2f} "
                    f"({hand[role]['records']:,} records)" for role in NAMES) + ".\n")


def steady_us(result: dict[str, Any]) -> float:
    """CPU per record between a hand-written process's first and last record."""
    cpu: float = result["cpu_last"] - result["cpu_first"]
    records: int = result["records"]
    return cpu / max(records, 1) * 1e6


@dataclass
class Round:
    """One measurement: the raw passes (slowest first), both hand-written chains, the
    onceflow chain, and where its workers' logs are."""

    raws: list[tuple[dict[str, float], float]]  # (result, process life)
    hands: dict[str, dict[str, dict[str, Any]]]
    report: ChaosReport
    probe: Probe
    workdir: Path

    @property
    def raw(self) -> tuple[dict[str, float], float]:
        return self.raws[len(self.raws) // 2]  # the median pass's rate (and its life)

    @property
    def raw_rate(self) -> float:
        return self.raw[0]["records"] / self.raw[0]["seconds"]

    @property
    def kills(self) -> int:
        return sum(self.report.kills.values())

    def steady(self, messages: int) -> float:
        first, last, _ = self.probe.first_and_last("aggregator")
        return messages / (last - first)

    def hand_rate(self, wire: str, messages: int) -> float:
        hand = self.hands[wire]["aggregator"]
        return messages / float(hand["last"] - hand["first"])

    def worker_us(self, name: str) -> float:
        """A role's CPU per record it processed in its steady state (``Probe.steady_us``)."""
        return self.probe.steady_us(name)[0]

    def end_to_end(self) -> float:
        """Seconds from both workers' start to the aggregator's last commit (with kills each
        incarnation's gauges start over: the harness's view of the end instead)."""
        timeline = self.report.timeline
        done = timeline["aggregator committed"] if self.kills else \
            self.probe.committed_at("aggregator")
        return done - timeline["workers started"]

    def raw_end_to_end(self) -> float:
        """The raw child's records over its whole life (start, join, consume, stop)."""
        return self.raw[0]["records"] / self.raw[1]

    def score(self, messages: int) -> float:
        """The ratio rounds are ranked by: steady state, or end to end with kills."""
        if not self.kills:
            return self.steady(messages) / self.raw_rate
        return messages / self.end_to_end() / self.raw_end_to_end()


def measure_round(args: argparse.Namespace, kafka: services.ServiceInfo, baseline: str,
                  settings: dict[str, str], services_pids: dict[str, int], workdir: Path,
                  tag: str) -> Round:
    """The raw loop, both hand-written chains and the onceflow chain, one after another on
    the same input; ``tag`` keeps each round's topics and store rows apart."""
    workdir.mkdir(parents=True, exist_ok=True)
    raws: list[tuple[dict[str, float], float]] = []
    for _ in range(args.raw_repeat):  # one pass lasts ~0.5 s: its rate varies by ~20%
        spawned = time.monotonic()
        result = measure_raw(kafka.address, baseline, args.messages, "json")
        raws.append((result, time.monotonic() - spawned))
    raws.sort(key=lambda run: run[0]["records"] / run[0]["seconds"])
    hands = {}
    for wire in WIRES:  # the hand-written chain, on its own wire and on onceflow's
        hand_topic = f"baseline-{wire}-{tag}"
        asyncio.run(harness.create_topic(kafka.address, hand_topic, PARTITIONS))
        hands[wire] = measure_chain(kafka.address, baseline, hand_topic, args.messages, wire)
    workers = [*NAMES, *(f"aggregator-{n}" for n in range(2, args.aggregators + 1))]
    ports = {worker: services.free_port() for worker in workers}
    worker_settings = {name: {"onceflow.metrics.port": str(port),
                              "onceflow.persistence.interval": args.persistence_interval,
                              "onceflow.commit.interval": args.commit_interval,
                              **({"onceflow.cpu": args.cpu[name]} if name in args.cpu else {})}
                       for name, port in ports.items()}
    probe = Probe(ports, services_pids)
    options = ChaosOptions(messages=args.messages, duration=0, kills=args.kills,
                           seed=args.seed, store=args.store, units=not args.per_value,
                           aggregators=args.aggregators)
    probe.start()
    try:
        report = run_chaos(options, bootstrap=kafka.address, store_settings=settings,
                           workdir=workdir, worker_settings=worker_settings)
    finally:
        probe.done.set()
    return Round(raws, hands, report, probe, workdir)


def section(args: argparse.Namespace, run: Round, heading: str) -> list[str]:
    """One round in full: the ratios on each footing, CPU, and the chain's timeline."""
    raws, hands, report, probe = run.raws, run.hands, run.report, run.probe
    raw, raw_life = run.raw
    raw_rate = run.raw_rate
    raw_rates = ", ".join(f"{r['records'] / r['seconds']:,.0f}" for r, _ in raws)
    first, last, _ = probe.first_and_last("aggregator")  # with kills: the first incarnation's
    steady = run.steady(args.messages)
    kills = run.kills
    end_to_end = run.end_to_end()
    chain_e2e, raw_e2e = args.messages / end_to_end, run.raw_end_to_end()
    whole = args.messages / report.elapsed
    hand, wired = hands["json"], hands["envelope"]
    hand_rate, wired_rate = run.hand_rate("json", args.messages), run.hand_rate(
        "envelope", args.messages)
    hand_span, wired_span = args.messages / hand_rate, args.messages / wired_rate
    return [
        heading,
        "",
        f"Command: `{command(args)}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.messages:,} records ({report.events:,} events), {PARTITIONS} partitions; "
        f"kills {report.kills}; verdict: {'exact' if report.exact else 'DRIFT'} "
        f"(lost {report.lost}, double {report.double}).",
        "",
        "| footing | raw aiokafka getmany + decode, records/s | chain, records/s | ratio |",
        "|---|---:|---:|---:|",
        f"| steady state: first to last record (chain: the aggregator's) | {raw_rate:,.0f} "
        f"({raw['seconds']:.2f} s; median of {raw_rates}) | {steady:,.0f} "
        f"({last - first:.2f} s) "
        f"| **{steady / raw_rate:.3f}** |" if not kills else
        "| steady state | n/a with kills (each restart resets the counters) | | |",
        f"| steady state, hand-written at-least-once chain instead (`raw_chain.py`: "
        f"json.loads, one record per report, in-memory windows; no dedup, no state store; "
        f"no kills): first to last record (its aggregator's) | {raw_rate:,.0f} "
        f"| {hand_rate:,.0f} ({hand_span:.2f} s) | **{hand_rate / raw_rate:.3f}** |",
        f"| steady state, the hand-written chain on onceflow's wire (`raw_chain.py`, envelope "
        f"wire: unit envelopes between the processes, the example's functions; otherwise as "
        f"above) | {raw_rate:,.0f} | {wired_rate:,.0f} ({wired_span:.2f} s) "
        f"| **{wired_rate / raw_rate:.3f}** |",
        f"| end to end: process start to done (chain: to the aggregator's last commit"
        f"{', as the harness saw it' if kills else ''}) "
        f"| {raw_e2e:,.0f} ({raw_life:.2f} s) | {chain_e2e:,.0f} ({end_to_end:.2f} s) "
        f"| **{chain_e2e / raw_e2e:.3f}** |",
        f"| whole chaos run ({kills} SIGKILLs), generation to checked (earlier sections' "
        f"figure) / raw steady | {raw_rate:,.0f} | {whole:,.0f} ({report.elapsed:.1f} s) "
        f"| {whole / raw_rate:.3f} |",
        "",
        "onceflow chain / hand-written chain, steady state: "
        + (f"**{steady / hand_rate:.3f}**" if not kills else "n/a with kills") + ".",
        "",
        "CPU time of each worker process (user + system, until its last reading before "
        "it stopped; start-up included): "
        + (", ".join(f"{name} {probe.cpu_of(name):.2f} s ("
                     f"{probe.cpu_of(name) / args.messages * 1e6:.1f} us per input record)"
                     for name in NAMES) if not kills else "n/a with kills") + ".",
        "",
        *(steady_cpu_lines(probe, first, last) if not kills else []),
        *(hand_lines(name, chain, report.events, args.messages)
          for name, chain in (("hand-written chain", hand),
                              ("hand-written chain on onceflow's wire", wired))),
        "Timeline of the chain, seconds after both worker processes were started:",
        "",
        "| moment | s |",
        "|---|---:|",
        *timeline_rows(report, probe, run.workdir),
        "",
    ]


def rounds_table(args: argparse.Namespace, rounds: list[Round]) -> list[str]:
    """Every round's figures in one table, and each column's median."""
    n = args.messages
    rows = [(r.raw_rate, r.steady(n), r.score(n), r.hand_rate("envelope", n),
             r.steady(n) / r.hand_rate("envelope", n), r.worker_us("aggregator"),
             r.worker_us("republisher"), r.report.exact) for r in rounds]
    lines = [
        "| round | raw, records/s | chain, records/s | chain / raw | hand-written on "
        "onceflow's wire, records/s | chain / hand-written | aggregator, us per record | "
        "republisher, us per record | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, (raw, chain, ratio, hand, of_hand, agg, rep, exact) in enumerate(rows, 1):
        lines.append(f"| {i} | {raw:,.0f} | {chain:,.0f} | **{ratio:.3f}** | {hand:,.0f} "
                     f"| {of_hand:.3f} | {agg:.1f} | {rep:.1f} | "
                     f"{'exact' if exact else 'DRIFT'} |")
    medians = [statistics.median(column) for column in list(zip(*rows, strict=True))[:7]]
    raw, chain, ratio, hand, of_hand, agg, rep = medians
    lines.append(f"| median | {raw:,.0f} | {chain:,.0f} | **{ratio:.3f}** | {hand:,.0f} "
                 f"| {of_hand:.3f} | {agg:.1f} | {rep:.1f} | |")
    return lines


def command(args: argparse.Namespace) -> str:
    return (f".venv/bin/python benchmarks/chaos_throughput.py --messages {args.messages} "
            f"--kills {args.kills} --seed {args.seed} --store {args.store} "
            f"--persistence-interval {args.persistence_interval} "
            f"--commit-interval {args.commit_interval} --raw-repeat {args.raw_repeat}"
            f"{' --per-value' * args.per_value}"
            f"{f' --aggregators {args.aggregators}' if args.aggregators > 1 else ''}"
            f"{f' --repeat {args.repeat}' if args.repeat > 1 else ''}"
            f"{''.join(f' --cpu {name}={cpu}' for name, cpu in sorted(args.cpu.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--store", choices=("redis", "cassandra"), default="redis")
    parser.add_argument("--persistence-interval", default="500ms",
                        help="both workers' onceflow.persistence.interval (demo.conf: 500ms)")
    parser.add_argument("--commit-interval", default="2s",
                        help="both workers' onceflow.commit.interval (demo.conf: 2s)")
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    parser.add_argument("--raw-repeat", type=int, default=3,
                        help="passes of the raw loop; the median pass is the baseline")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of the whole measurement (raw, hand-written, onceflow), "
                             "one after another on the same broker and store: a table of "
                             "every round and their medians, and the median round in full")
    parser.add_argument("--aggregators", type=int, default=1,
                        help="aggregator processes in the onceflow chain (one group); the "
                             "chain's figures are theirs together")
    parser.add_argument("--per-value", action="store_true",
                        help="republish one record per event (default: one unit per report)")
    parser.add_argument("--cpu", action="append", default=[], metavar="WORKER=CPU",
                        help="a worker's onceflow.cpu (e.g. republisher=0, aggregator=off); "
                             "default: the setting's own (auto)")
    args = parser.parse_args()
    try:
        args.cpu = dict(pair.split("=", 1) for pair in args.cpu)
    except ValueError:
        parser.error("--cpu takes WORKER=CPU, e.g. republisher=0")
    if min(args.repeat, args.raw_repeat, args.aggregators) < 1:
        parser.error("--repeat, --raw-repeat and --aggregators take a positive count")
    if not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: no such directory (results are appended to a page there)")
    tree = os.environ.get("BENCH_WORKER_TREE")
    if tree:  # the workers run the tree's code: ``python -m onceflow`` imports from its cwd
        args.out = args.out.resolve()
        os.environ["PYTHONPATH"] = worker_path(os.environ)
        os.chdir(tree)
    state = Path(tempfile.mkdtemp(prefix="onceflow-chaos-bench-"))
    kafka = services.start_tansu(state / "kafka")
    rounds: list[Round] = []
    try:
        db, _ = start_store(args.store, state, "bench")
        try:
            stream = generate(args.messages, seed=args.seed, disorder=0.05)
            baseline = "baseline"
            asyncio.run(harness.create_topic(kafka.address, baseline, PARTITIONS))
            asyncio.run(harness.produce(kafka.address, baseline, stream.messages))
            for i in range(args.repeat):  # each round's store rows under a namespace of its own
                settings = store_settings(args.store, db, f"bench{i}")
                rounds.append(measure_round(args, kafka, baseline, settings,
                                            {"broker": kafka.pid, "store": db.pid},
                                            state / f"round-{i}", str(i)))
                print(f"round {i + 1}/{args.repeat}: chain / raw "
                      f"{rounds[-1].score(args.messages):.3f}", flush=True)
        finally:
            services.stop(db)
    finally:
        services.stop(kafka)
    heading = f"## chaos_throughput.py --store {args.store}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    if len(rounds) == 1:
        text = "\n".join(section(args, rounds[0], heading))
    else:
        ranked = sorted(range(len(rounds)), key=lambda i: rounds[i].score(args.messages))
        middle = ranked[len(ranked) // 2]
        text = "\n".join([
            f"{heading}, {len(rounds)} rounds",
            "",
            f"Command: `{command(args)}`. Each round runs the raw loop ({args.raw_repeat} "
            f"pass{'es' * (args.raw_repeat > 1)}, the median pass its baseline), both "
            "hand-written chains and the onceflow chain, one after another on the same "
            "broker and store (a namespace of its own per round); the rounds follow each "
            "other. Ranked by the chain's ratio"
            + (" (steady state)" if not args.kills else " (end to end)") + ".",
            "",
            *rounds_table(args, rounds),
            "",
            *section(args, rounds[middle], f"### The median round ({middle + 1}) in full"),
        ])
    print(text)
    append(args.out, text)


if __name__ == "__main__":
    main()
