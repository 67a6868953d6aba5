"""Scale-out: one worker beside two worker processes in one consumer group, same topic, same run.

The robots aggregate path of ``throughput.py`` (plain JSON, producer-sequence
dedup, flat-map, aggregate, Redis persist, commit; ``demo.conf`` with the
topic from ``ONCEFLOW_ROBOTS_TOPIC``) over ``--partitions`` partitions. Each
run reads the whole topic with a new group id and its own Redis prefix:
either one ``onceflow run`` worker, or two started together (Kafka gives each
half of the partitions). Rates count input records from the first
"partitions assigned" line of the run's workers (a rebalance after it counts
against the two) until every input is committed. Runs alternate one / two.

    python benchmarks/scale_out.py [--messages 300000] [--repeat 3] [--partitions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import (
    CommitWatcher,
    RssSampler,
    Worker,
    append,
    chunked,
    journal_page,
    machine,
    produce_chunks,
)

from onceflow.devtools import harness, services
from onceflow.devtools.chaos import start_store
from onceflow.devtools.robot_stream import generate

Measure = dict[str, float]


def measure(bootstrap: str, store: dict[str, str], topic: str, ends: dict[int, int],
            workers: int, workdir: Path) -> Measure:
    group = f"scale-{workers}-{time.monotonic_ns()}"
    settings = {"onceflow.kafka.bootstrap-servers": bootstrap, "onceflow.kafka.group-id": group,
                **store, "onceflow.stores.redis.key-prefix": group,
                "onceflow.persistence.interval": "250ms", "onceflow.commit.interval": "250ms"}
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic, "ONCEFLOW_ROBOTS_STORE": "redis"}
    procs = [Worker(settings, env, workdir / f"{group}-{n}.log") for n in range(workers)]
    rss = RssSampler([w.proc.pid for w in procs])
    watcher = CommitWatcher(bootstrap, group, topic, ends)
    try:
        done = watcher.wait(procs, 3600)
    finally:
        watcher.close()
        rss.close()
        for worker in procs:
            worker.stop()
    assigned = [w.assignments() for w in procs]
    if not all(assigned):
        raise RuntimeError(f"a worker had no assignment; see {workdir}")
    firsts = [a[0][0] for a in assigned]
    result = {"records": sum(ends.values()), "seconds": done - min(firsts),
              "join_spread": max(firsts) - min(firsts),
              "assignments": sum(len(a) for a in assigned),
              "peak_rss_mb": rss.peak / 2**20, "peak_rss_each_mb": max(rss.peaks) / 2**20}
    if result["assignments"] == workers:  # no rebalance: each worker's own rate
        for n, [(at, partitions)] in enumerate(assigned):
            records = sum(ends[p] for p in partitions)
            finished = max(watcher.reached[p] for p in partitions)
            result[f"worker{n}_rate"] = records / (finished - at)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-scale-bench-"))
    kafka = services.start_tansu(state / "kafka")
    db, store = start_store("redis", state, "unused")
    runs: list[tuple[Measure, Measure]] = []
    try:
        topic = f"robots-{int(time.time())}"
        asyncio.run(harness.create_topic(kafka.address, topic, args.partitions))
        stream = generate(args.messages, seed=11)
        produced = asyncio.run(produce_chunks(kafka.address, topic,
                                              chunked(stream.messages, 20_000)))
        ends = {p: produced.get(p, 0) for p in range(args.partitions)}
        for _ in range(args.repeat):
            runs.append((measure(kafka.address, store, topic, ends, 1, state),
                         measure(kafka.address, store, topic, ends, 2, state)))
    finally:
        services.stop(kafka)
        services.stop(db)
    report = render(args, stream.events, runs)
    print(report)
    append(args.out, report)


def render(args: argparse.Namespace, events: int, runs: list[tuple[Measure, Measure]]) -> str:
    def rate(m: Measure) -> float:
        return m["records"] / m["seconds"]

    ratios = sorted(rate(two) / rate(one) for one, two in runs)
    lines = [
        f"## scale_out.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/scale_out.py --messages {args.messages} "
        f"--repeat {args.repeat} --partitions {args.partitions}`  ",
        f"Machine: {machine()}; Tansu and Redis started by the benchmark; {args.messages:,} "
        f"plain JSON robot reports ({events:,} fastening events), {args.partitions} "
        "partitions, 1,000 robots; the robots pipeline (sequence dedup, flat-map, aggregate, "
        "Redis persist, commit); runs alternate one / two workers.",
        "",
        "| run | workers | records/s | events/s | seconds | each worker's records/s | "
        "assignments | first joins apart s | peak RSS MB (sum) | peak RSS MB (largest) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, pair in enumerate(runs, 1):
        for workers, m in zip((1, 2), pair, strict=True):
            each = " + ".join(f"{m[f'worker{w}_rate']:,.0f}" for w in range(workers)
                              if f"worker{w}_rate" in m) or "-"
            lines.append(
                f"| {n} | {workers} | {rate(m):,.0f} | {rate(m) * events / args.messages:,.0f} "
                f"| {m['seconds']:.2f} | {each} | {m['assignments']:.0f} | "
                f"{m['join_spread']:.2f} | {m['peak_rss_mb']:.0f} | {m['peak_rss_each_mb']:.0f} |")
    median = ratios[len(ratios) // 2]
    lines += [
        "", f"**Ratio two workers / one: median {median:.2f}** "
        f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})", "",
        f"The machine has {os.cpu_count()} cores, shared by the broker (Tansu), Redis, the "
        "worker processes and the benchmark driver: a second worker can take at most what "
        "the first leaves of them, so this ratio is a floor for hosts with a core per "
        "worker. records/s counts from the run's first \"partitions assigned\" line to the "
        "last commit, so it includes any gap between the two workers' assignments (\"first "
        "joins apart\": 0 to 1 s on Tansu, whose SyncGroup answer to a follower sometimes "
        "comes a second after the leader's). Each "
        "worker's records/s counts its own partitions from its own assignment until they "
        "were committed. \"assignments\" counts the \"partitions assigned\" lines (one per "
        "worker: no rebalance).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
