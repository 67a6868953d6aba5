"""A stateless republisher (flat-map 1 -> 3) beside a hand-written at-least-once loop.

Input: ``{"id": i, "parts": 3}`` plain JSON records keyed by id over 4
partitions. (a) Baseline, in its own process: a raw aiokafka loop that
consumes a batch, produces each item's 3 parts (plain JSON, keyed by id),
awaits the sends and commits, once per batch; one ``send`` per part. (a')
The same loop sending as onceflow's producer does: per partition, in as few
``send_batch`` batches as hold a batch's parts (since 2026-11-25; one
``send`` per record costs aiokafka about 10 us). (b) An ``onceflow run``
worker running ``bench_pipelines:republisher`` (non-exclusive republish,
envelopes by default or plain JSON with the origin in headers with
``--format json``; input committed after every output is acknowledged).
Rates count input records from assignment (onceflow: its "partitions
assigned" log line; raw: its first record) until the last input is
committed. Runs alternate raw / onceflow on the same input topic, each into
an output topic of its own.

    python benchmarks/republisher.py [--messages 200000] [--repeat 3] [--format envelope|json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
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
    count_records,
    journal_page,
    machine,
    produce_chunks,
    raw_republish,
)

from onceflow.devtools import harness, services
from onceflow.devtools.chaos import start_store

PARTITIONS = 4
PARTS = 3
Measure = dict[str, float]


def raw_child(bootstrap: str, topic: str, output: str, expected: int, batched: bool) -> None:
    """The baseline (``common.raw_republish``), parts keyed like their input."""
    print(json.dumps(asyncio.run(raw_republish(bootstrap, topic, output, expected,
                                               same_partition=False, batched=batched))))


def measure_raw(bootstrap: str, topic: str, expected: int, batched: bool) -> Measure:
    output = f"{topic}-raw-{time.monotonic_ns()}"
    asyncio.run(harness.create_topic(bootstrap, output, PARTITIONS))
    proc = subprocess.Popen([sys.executable, __file__, "raw-child", bootstrap, topic, output,
                             str(expected), "batched" if batched else "send"],
                            stdout=subprocess.PIPE)
    rss = RssSampler([proc.pid])
    out, _ = proc.communicate()
    rss.close()
    if proc.returncode != 0:
        raise RuntimeError("raw baseline failed")
    result: Measure = json.loads(out)
    result["peak_rss_mb"] = rss.peak / 2**20
    return result


def measure_onceflow(bootstrap: str, store: dict[str, str], topic: str, ends: dict[int, int],
                     fmt: str, workdir: Path) -> Measure:
    group = f"bench-rep-{time.monotonic_ns()}"
    output = f"{topic}-out-{time.monotonic_ns()}"
    asyncio.run(harness.create_topic(bootstrap, output, PARTITIONS))
    settings = {"onceflow.pipeline": "bench_pipelines:republisher",
                "onceflow.kafka.bootstrap-servers": bootstrap, "onceflow.kafka.group-id": group,
                "onceflow.persistence.interval": "250ms", "onceflow.commit.interval": "250ms",
                **store}
    env = {**os.environ, "BENCH_TOPIC": topic, "BENCH_OUTPUT": output, "BENCH_FORMAT": fmt}
    worker = Worker(settings, env, workdir / f"{group}.log")
    rss = RssSampler([worker.proc.pid])
    watcher = CommitWatcher(bootstrap, group, topic, ends)
    try:
        done = watcher.wait([worker], 3600)
    finally:
        watcher.close()
        rss.close()
        worker.stop()
    assigned = worker.assignments()
    if not assigned:
        raise RuntimeError(f"no assignment in {worker.log}")
    outputs = asyncio.run(count_records(bootstrap, output, PARTITIONS))
    return {"records": sum(ends.values()), "seconds": done - assigned[0][0],
            "peak_rss_mb": rss.peak / 2**20, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each path")
    parser.add_argument("--format", choices=("envelope", "json"), default="envelope",
                        help="what onceflow writes (the raw loop writes plain JSON)")
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-republisher-bench-"))
    kafka = services.start_tansu(state / "kafka")
    db, store = start_store("redis", state, f"bench{int(time.time())}")
    runs: list[tuple[Measure, Measure, Measure]] = []
    try:
        topic = f"items-{int(time.time())}"
        asyncio.run(harness.create_topic(kafka.address, topic, PARTITIONS))
        items = ((str(i).encode(), json.dumps({"id": i, "parts": PARTS}).encode())
                 for i in range(args.messages))
        produced = asyncio.run(produce_chunks(kafka.address, topic, chunked(items, 20_000)))
        ends = {p: produced.get(p, 0) for p in range(PARTITIONS)}
        for _ in range(args.repeat):
            runs.append((measure_raw(kafka.address, topic, args.messages, batched=False),
                         measure_raw(kafka.address, topic, args.messages, batched=True),
                         measure_onceflow(kafka.address, store, topic, ends, args.format,
                                          state)))
    finally:
        services.stop(kafka)
        services.stop(db)
    report = render(args, runs)
    print(report)
    append(args.out, report)


def render(args: argparse.Namespace, runs: list[tuple[Measure, Measure, Measure]]) -> str:
    def rate(m: Measure) -> float:
        return m["records"] / m["seconds"]

    ratios = sorted(rate(full) / rate(raw) for raw, _, full in runs)
    batched_ratios = sorted(rate(full) / rate(batched) for _, batched, full in runs)
    what = "envelopes" if args.format == "envelope" else "plain JSON, origin in headers"
    lines = [
        f"## republisher.py --format {args.format}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/republisher.py --messages {args.messages} "
        f"--repeat {args.repeat} --format {args.format}`  ",
        f"Machine: {machine()}; Tansu and Redis started by the benchmark; "
        f"{args.messages:,} plain JSON items, {PARTITIONS} partitions, {PARTS} outputs each "
        "(keyed by id); runs alternate raw (one send per record), raw (send_batch), "
        "onceflow.",
        "",
        "| run | path | input records/s | output records/s | seconds | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for n, (raw, batched, full) in enumerate(runs, 1):
        for name, m in (("raw aiokafka consume, produce 3 (plain JSON), await sends, commit",
                         raw),
                        ("the same raw loop, its sends per partition by send_batch", batched),
                        (f"onceflow stateless republisher (flat-map 1->3, {what}, "
                         "commit after acks)", full)):
            lines.append(f"| {n} | {name} | {rate(m):,.0f} | {rate(m) * PARTS:,.0f} | "
                         f"{m['seconds']:.2f} | {m['peak_rss_mb']:.0f} |")
    outputs = ", ".join(f"{full['outputs']:,.0f}" for *_, full in runs)
    median = ratios[len(ratios) // 2]
    batched_median = batched_ratios[len(batched_ratios) // 2]
    lines += ["", f"**Ratio onceflow / raw: median {median:.2f}** "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)}; issue 13 target >= 0.50)",
              "", f"**Ratio onceflow / raw sending by send_batch: median {batched_median:.2f}** "
              f"(runs: {', '.join(f'{r:.2f}' for r in batched_ratios)})",
              "", f"Records in onceflow's output topics, read back after each run: {outputs} "
              f"(expected {args.messages * PARTS:,}; more would be re-sends).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-child":
        raw_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
                  sys.argv[6] == "batched")
    else:
        main()
