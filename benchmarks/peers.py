"""The peers' workload: a per-key sum over a plain JSON topic, onceflow beside raw aiokafka.

The workload onceflow was compared with other stream processors on (issue 30;
the peers themselves are not run here: they are no dependencies of the project):
``{"key": "k0042", "value": 17}`` records
keyed by key, 1,000 keys over 4 partitions, one running sum per key.
onceflow: an ``onceflow run`` worker running ``bench_pipelines:per_key_sum``
(``format="json"``, one aggregate), states persisted to Redis and offsets
committed after the states are stored. Baseline, in its own process: an
aiokafka ``getmany`` loop doing ``json.loads`` and the sum in a dict (no store,
no commit). Rates count records from assignment (onceflow: its "partitions
assigned" log line; raw: its first record) to the last record (onceflow: its
committed offsets reached the end). Runs alternate raw / onceflow on one topic.

    python benchmarks/peers.py [--messages 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import append, journal_page, machine, raw_consume
from throughput import measure_onceflow, peak_rss_while, produce

from onceflow.devtools import services
from onceflow.devtools.chaos import start_store
from onceflow.devtools.harness import create_topic

PARTITIONS = 4
KEYS = 1000
Measure = dict[str, float]


def records(messages: int, seed: int = 11) -> list[tuple[bytes, bytes]]:
    """``messages`` records over ``KEYS`` keys: (key, ``{"key", "value"}``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(messages):
        key = f"k{rng.randrange(KEYS):04d}"
        out.append((key.encode(), json.dumps({"key": key, "value": rng.randrange(100)},
                                             separators=(",", ":")).encode()))
    return out


def raw_child(bootstrap: str, topic: str, expected: int) -> None:
    """The baseline: getmany, ``json.loads`` and the per-key sum in a dict."""

    sums: Counter[str] = Counter()

    def handle(records: list[Any]) -> int:
        for record in records:
            item = json.loads(record.value)
            sums[item["key"]] += item["value"]
        return len(records)

    result = asyncio.run(raw_consume(bootstrap, topic, expected, handle))
    print(json.dumps({**result, "keys": len(sums)}))


def measure_raw(bootstrap: str, topic: str, expected: int) -> Measure:
    proc = subprocess.Popen([sys.executable, __file__, "raw-child", bootstrap, topic,
                             str(expected)], stdout=subprocess.PIPE)
    _, peak = peak_rss_while(proc, lambda: False)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("raw baseline failed")
    result: Measure = json.loads(out)
    result["peak_rss_mb"] = peak / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each path")
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-peers-bench-"))
    kafka = services.start_tansu(state / "kafka")
    db, store = start_store("redis", state, "{group}")  # keys prefixed per run's group
    store["kind"] = "redis"
    runs: list[tuple[Measure, Measure]] = []
    try:
        topic = f"peers-{int(time.time())}"
        asyncio.run(create_topic(kafka.address, topic, PARTITIONS))
        ends = asyncio.run(produce(kafka.address, topic, records(args.messages), []))
        for _ in range(args.repeat):
            raw = measure_raw(kafka.address, topic, args.messages)
            full = measure_onceflow(kafka.address, store, topic, ends, args.messages, state,
                                    pipeline="per_key_sum")
            runs.append((raw, full))
    finally:
        services.stop(kafka)
        services.stop(db)
    report = render(args, runs)
    print(report)
    append(args.out, report)


def render(args: argparse.Namespace, runs: list[tuple[Measure, Measure]]) -> str:
    def rate(m: Measure) -> float:
        return m["records"] / m["seconds"]

    ratios = sorted(rate(full) / rate(raw) for raw, full in runs)
    lines = [
        f"## peers.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/peers.py --messages {args.messages} "
        f"--repeat {args.repeat}`  ",
        f"Machine: {machine()}; Tansu and Redis started by the benchmark; "
        f"{args.messages:,} plain JSON records, {PARTITIONS} partitions, {KEYS:,} keys, a sum "
        "per key; runs alternate raw / onceflow; load average at the end "
        f"{os.getloadavg()[0]:.1f}.",
        "",
        "| run | path | records/s | seconds | peak RSS MB |",
        "|---|---|---:|---:|---:|",
    ]
    for n, (raw, full) in enumerate(runs, 1):
        for name, m in (("raw aiokafka getmany + json.loads + a dict of sums", raw),
                        ("onceflow one worker (json, aggregate, Redis persist, commit after "
                         "persist)", full)):
            lines.append(f"| {n} | {name} | {rate(m):,.0f} | {m['seconds']:.2f} | "
                         f"{m['peak_rss_mb']:.0f} |")
    median = ratios[len(ratios) // 2]
    folded = ", ".join(f"{full['folded']:,}" for _, full in runs)
    lines += ["", f"**Ratio onceflow / raw: median {median:.2f}** "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})", "",
              f"Values folded by each onceflow run (its last periodic stats line, which may lag "
              f"the end): {folded} (expected {args.messages:,}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-child":
        raw_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
