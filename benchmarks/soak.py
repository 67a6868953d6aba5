"""Memory boundedness: a worker folding 10M events over 2M keys with a bounded state cache.

Input: ``--events`` events over ``--keys`` distinct keys, ``--per-record``
events per record (plain JSON ``{"k": key, "v": [..]}``, Kafka key = key,
keys drawn uniformly at random, seeded), 4 partitions, produced once. The
pipeline (``bench_pipelines:soak``) flat-maps each record into its events
and folds them into a small per-key state in Redis. One ``onceflow run``
worker reads it all with ``onceflow.state.cache.max-states = --cache``,
while psutil samples its RSS every 50 ms; peak RSS is taken when half the
input is committed and at the end (a bounded worker: within 5%), and its
RSS at each quarter shows a trend apart from a single spike. Then the
same input again (new group, new Redis prefix) with the cache unbounded
(``--unbounded`` states), the "before". Rates count from the worker's
"partitions assigned" line until every input is committed.

    python benchmarks/soak.py [--events 10000000] [--keys 2000000] [--cache 200000]
    python benchmarks/soak.py --events 200000 --keys 40000 --cache 4000   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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

PARTITIONS = 4
Measure = dict[str, Any]


def records(events: int, keys: int, per_record: int, seed: int) -> Iterator[tuple[bytes, bytes]]:
    """``events / per_record`` records, each ``per_record`` events for one random key."""
    rng = random.Random(seed)
    width = len(str(keys - 1))
    for _ in range(events // per_record):
        key = f"k{rng.randrange(keys):0{width}d}"
        values = [rng.randrange(100) for _ in range(per_record)]
        yield key.encode(), json.dumps({"k": key, "v": values}, separators=(",", ":")).encode()


def measure(bootstrap: str, store: dict[str, str], topic: str, ends: dict[int, int],
            per_record: int, cache: int, workdir: Path) -> Measure:
    group = f"soak-{cache}-{time.monotonic_ns()}"
    settings = {"onceflow.pipeline": "bench_pipelines:soak",
                "onceflow.kafka.bootstrap-servers": bootstrap, "onceflow.kafka.group-id": group,
                **store, "onceflow.stores.redis.key-prefix": group,
                "onceflow.state.cache.max-states": str(cache),
                "onceflow.persistence.interval": "250ms", "onceflow.commit.interval": "250ms",
                "onceflow.metrics.stats-interval": "1s"}
    worker = Worker(settings, {**os.environ, "BENCH_TOPIC": topic}, workdir / f"{group}.log")
    rss = RssSampler([worker.proc.pid])
    watcher = CommitWatcher(bootstrap, group, topic, ends)
    total = sum(ends.values())
    half: Measure = {}
    shown = [time.monotonic()]

    quarters: list[float] = []  # RSS when a quarter, half, ... of the input was committed

    def progress(done: int) -> None:
        if done >= total / 2 and not half:
            half.update(at=time.time(), rss=rss.peak)
        while len(quarters) < 4 and done >= total * (len(quarters) + 1) / 4:
            quarters.append(rss.last / 2**20)
        if time.monotonic() - shown[0] > 30:
            shown[0] = time.monotonic()
            print(f"  cache {cache:,}: {done:,}/{total:,} records committed, "
                  f"RSS peak {rss.peak / 2**20:,.0f} MB", file=sys.stderr)

    try:
        done = watcher.wait([worker], 6 * 3600, progress)
        time.sleep(1.5)  # one more stats line, covering everything folded
    finally:
        watcher.close()
        rss.close()
        worker.stop()
    assigned = worker.assignments()
    if not assigned:
        raise RuntimeError(f"no assignment in {worker.log}")
    cache_line = worker.last_line("state cache ")
    folded = re.search(r"'per_key\.folded': (\d+)", worker.last_line("stats "))
    evictions = re.search(r"'per_key\.evicted': (\d+)", cache_line)
    reloads = re.search(r"'per_key\.reloaded': (\d+)", cache_line)
    return {"records": total, "events": total * per_record, "seconds": done - assigned[0][0],
            "half_seconds": half["at"] - assigned[0][0], "rss_half_mb": half["rss"] / 2**20,
            "rss_end_mb": rss.peak / 2**20,
            "rss_quarters": " / ".join(f"{q:,.0f}" for q in quarters),
            "folded": float(folded[1]) if folded else -1.0,
            # The counters appear in the line from the first eviction or reload on.
            "evictions": float(evictions[1]) if evictions else 0.0 if cache_line else -1.0,
            "reloads": float(reloads[1]) if reloads else 0.0 if cache_line else -1.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--per-record", type=int, default=2, help="events per record")
    parser.add_argument("--cache", type=int, default=200_000, help="max-states, bounded run")
    parser.add_argument("--unbounded", type=int, default=1_000_000_000,
                        help="max-states of the 'before' run (0: skip it)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-soak-bench-"))
    kafka = services.start_tansu(state / "kafka")
    db, store = start_store("redis", state, "unused")
    runs: list[tuple[int, Measure]] = []
    try:
        topic = f"soak-{int(time.time())}"
        asyncio.run(harness.create_topic(kafka.address, topic, PARTITIONS))
        started = time.monotonic()
        stream = records(args.events, args.keys, args.per_record, args.seed)
        produced = asyncio.run(produce_chunks(kafka.address, topic, chunked(stream, 20_000)))
        ends = {p: produced.get(p, 0) for p in range(PARTITIONS)}
        print(f"produced {sum(ends.values()):,} records in {time.monotonic() - started:.0f}s",
              file=sys.stderr)
        for cache in (args.cache, args.unbounded):
            if cache:
                runs.append((cache, measure(kafka.address, store, topic, ends,
                                            args.per_record, cache, state)))
    finally:
        services.stop(kafka)
        services.stop(db)
    report = render(args, runs)
    print(report)
    append(args.out, report)


def render(args: argparse.Namespace, runs: list[tuple[int, Measure]]) -> str:
    events = (args.events // args.per_record) * args.per_record
    lines = [
        f"## soak.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/soak.py --events {args.events} --keys "
        f"{args.keys} --per-record {args.per_record} --cache {args.cache} --unbounded "
        f"{args.unbounded} --seed {args.seed}`  ",
        f"Machine: {machine()}; Tansu and Redis started by the benchmark; {events:,} events "
        f"over {args.keys:,} keys drawn uniformly, {args.per_record} per record (one key per "
        f"record), {PARTITIONS} partitions; one worker per run; RSS of the worker sampled "
        "every 50 ms.",
        "",
        "| max-states | records/s | events/s | events/s 1st half | events/s 2nd half | "
        "seconds | peak RSS MB at half | peak RSS MB at end | growth | RSS MB at 1/4, 1/2, 3/4, "
        "end | folded | evictions | reloads |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cache, m in runs:
        half_events = m["events"] / 2
        lines.append(
            f"| {cache:,} | {m['records'] / m['seconds']:,.0f} | "
            f"{m['events'] / m['seconds']:,.0f} | {half_events / m['half_seconds']:,.0f} | "
            f"{half_events / (m['seconds'] - m['half_seconds']):,.0f} | {m['seconds']:.1f} | "
            f"{m['rss_half_mb']:,.0f} | {m['rss_end_mb']:,.0f} | "
            f"{m['rss_end_mb'] / m['rss_half_mb'] - 1:+.1%} | {m['rss_quarters']} | "
            f"{m['folded']:,.0f} | "
            f"{m['evictions']:,.0f} | {m['reloads']:,.0f} |")
    bounded = runs[0][1]
    growth = bounded["rss_end_mb"] / bounded["rss_half_mb"] - 1
    lines += ["", f"**Bounded cache ({args.cache:,} states): peak RSS {growth:+.1%} from half "
              f"way ({events // 2:,} events) to the end ({events:,}); "
              f"{'within' if abs(growth) < 0.05 else 'NOT within'} 5%.**"]
    if len(runs) > 1:
        before = runs[1][1]
        lines.append(f"Unbounded: peak RSS {before['rss_end_mb']:,.0f} MB "
                     f"({before['rss_end_mb'] / bounded['rss_end_mb']:.1f}x the bounded run), "
                     f"throughput bounded / unbounded "
                     f"{before['seconds'] / bounded['seconds']:.2f}.")
    lines += ["", "Half way is the moment the committed offsets covered half the input "
              "(the worker has processed up to one commit interval more).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
