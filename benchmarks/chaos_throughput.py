"""Throughput of the two-process chaos run beside the raw consume ceiling, same run.

The raw ceiling: a plain aiokafka getmany + decode loop over the same input
(``throughput.raw_child``). The chaos run: ``onceflow chaos`` with all input
produced up front (``--duration 0``), the republisher and the windowed
aggregator SIGKILLed ``--kills`` times in all; records/s is input records
over the run's wall time, restarts and group rejoins included, until every
window is durable and committed.

    python benchmarks/chaos_throughput.py [--messages 30000] [--kills 10] [--store redis]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from throughput import PARTITIONS, measure_raw

from onceflow.devtools import harness, services
from onceflow.devtools.chaos import ChaosOptions, run_chaos, start_store
from onceflow.devtools.robot_stream import generate

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--store", choices=("redis", "cassandra"), default="redis")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-chaos-bench-"))
    kafka = services.start_tansu(state / "kafka")
    db, settings = start_store(args.store, state, "bench")
    try:
        stream = generate(args.messages, seed=args.seed, disorder=0.05)
        baseline = "baseline"
        asyncio.run(harness.create_topic(kafka.address, baseline, PARTITIONS))
        asyncio.run(harness.produce(kafka.address, baseline, stream.messages))
        raw = measure_raw(kafka.address, baseline, args.messages)
        options = ChaosOptions(messages=args.messages, duration=0, kills=args.kills,
                               seed=args.seed, store=args.store)
        report = run_chaos(options, bootstrap=kafka.address, store_settings=settings,
                           workdir=state)
    finally:
        services.stop(kafka)
        services.stop(db)
    raw_rate = raw["records"] / raw["seconds"]
    chaos_rate = args.messages / report.elapsed
    text = "\n".join([
        f"## chaos_throughput.py --store {args.store}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/chaos_throughput.py --messages {args.messages} "
        f"--kills {args.kills} --seed {args.seed} --store {args.store}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.messages:,} records ({report.events:,} events), {PARTITIONS} partitions; "
        f"kills {report.kills}; verdict: {'exact' if report.exact else 'DRIFT'} "
        f"(lost {report.lost}, double {report.double}).",
        "",
        "| path | records/s | seconds |",
        "|---|---:|---:|",
        f"| raw aiokafka getmany + decode | {raw_rate:,.0f} | {raw['seconds']:.2f} |",
        f"| chaos run: republisher + windowed aggregator, {sum(report.kills.values())} SIGKILLs "
        f"| {chaos_rate:,.0f} | {report.elapsed:.1f} |",
        "",
        f"**Ratio chaos run / raw: {chaos_rate / raw_rate:.3f}** (the run's wall time "
        "includes both group joins, a 2 s quiet period to find the republished topic's end, "
        "and with kills every restart: a SIGKILLed member holds its partitions until its "
        "session times out)",
        "",
    ])
    print(text)
    args.out.write_text(args.out.read_text().rstrip() + "\n\n" + text)


if __name__ == "__main__":
    main()
