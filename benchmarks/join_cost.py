"""What a join costs per record: a per-key sum without a join, with a join, and with the
join but no merge log (``ONCEFLOW_FAULT_NO_MERGE_LOG``: arrival order, unlogged); and what
the merge log costs a single worker (``onceflow.single-worker = true``: the per-key sum,
whose one order over the 4 partitions is logged), against the same worker without it.

Payments ``{"key", "value"}`` over ``KEYS`` keys and 4 partitions, and a table topic of
the same keys (co-partitioned) with one update every ``--update-every`` payments, all
produced before the runs. One ``onceflow run`` worker per run (Redis persist, commit
after persist) until the payments' offsets are committed; runs alternate the three
paths. Rates count from the worker's assignment to the commit of the last payment; the
cost per record is the difference of the seconds per payment.

    python benchmarks/join_cost.py [--messages 300000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import CommitWatcher, append, journal_page, machine, worker_cwd, worker_path
from throughput import peak_rss_while, produce

from onceflow.devtools import services
from onceflow.devtools.chaos import start_store
from onceflow.devtools.harness import create_topic, fault_aware, packaged_config, worker_command

PARTITIONS = 4
KEYS = 1000
#: name: (pipeline, without the merge log, single worker)
PATHS = {"no join": ("plain_sum", False, False), "join, merge log": ("join_sum", False, False),
         "join, no merge log": ("join_sum", True, False),
         "single worker, merge log": ("plain_sum", False, True),
         "single worker, no merge log": ("plain_sum", True, True)}


def inputs(messages: int, every: int, seed: int = 7
           ) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    rng = random.Random(seed)
    payments, rows = [], [(f"k{k:04d}".encode(), b'{"w":1}') for k in range(KEYS)]
    for i in range(messages):
        key = f"k{rng.randrange(KEYS):04d}"
        payments.append((key.encode(), json.dumps({"key": key, "value": rng.randrange(100)},
                                                  separators=(",", ":")).encode()))
        if i % every == 0:
            rows.append((key.encode(), json.dumps({"w": rng.randrange(1, 4)}).encode()))
    return payments, rows


def measure(bootstrap: str, store: dict[str, str], topic: str, table: str,
            ends: dict[int, int], pipeline: str, naive: bool, single: bool, workdir: Path
            ) -> float:
    """Seconds from the worker's assignment to the commit of every payment."""
    group = f"bench-{topic}-{time.monotonic_ns()}"
    settings = {"onceflow.kafka.bootstrap-servers": bootstrap, "onceflow.kafka.group-id": group,
                "onceflow.pipeline": f"join_pipelines:{pipeline}",
                "onceflow.persistence.interval": "250ms", "onceflow.commit.interval": "250ms",
                "onceflow.single-worker": "true" if single else "false",
                **{k: v.replace("{group}", group) for k, v in store.items() if k != "kind"}}
    env = {**os.environ, "BENCH_TOPIC": topic, "BENCH_TABLE": table,
           "PYTHONPATH": worker_path(os.environ)}
    if naive:
        env["ONCEFLOW_FAULT_NO_MERGE_LOG"] = "1"
    argv = fault_aware(worker_command(packaged_config("demo.conf"), settings), env)
    log = workdir / f"worker-{group}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=worker_cwd(os.environ), stdout=out,
                                stderr=subprocess.STDOUT)
    watcher = CommitWatcher(bootstrap, group, topic, ends)
    total = sum(ends.values())
    peak_rss_while(proc, lambda: watcher.committed() >= total)
    end = time.time()
    watcher.close()
    proc.terminate()
    proc.wait(15)
    text = log.read_text()
    match = re.search(r"^(\S+ \S+) INFO onceflow.kafka.\S+: partitions assigned", text, re.M)
    if not match:
        raise RuntimeError(f"no assignment in worker log:\n{text[-2000:]}")
    return end - datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--update-every", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=journal_page())
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-join-bench-"))
    kafka = services.start_tansu(state / "kafka")
    db, store = start_store("redis", state, "{group}")
    seconds: dict[str, list[float]] = {name: [] for name in PATHS}
    try:
        payments, rows = inputs(args.messages, args.update_every)
        for n in range(args.repeat):  # fresh topics per round: each path reads the same
            topic, table = f"pay-{int(time.time())}-{n}", f"table-{int(time.time())}-{n}"
            for name in (topic, table):
                asyncio.run(create_topic(kafka.address, name, PARTITIONS))
            asyncio.run(produce(kafka.address, table, rows, []))
            ends = asyncio.run(produce(kafka.address, topic, payments, []))
            for name, (pipeline, naive, single) in PATHS.items():
                seconds[name].append(measure(kafka.address, store, topic, table, ends,
                                             pipeline, naive, single, state))
    finally:
        services.stop(kafka)
        services.stop(db)
    report = render(args, len(rows), seconds)
    print(report)
    append(args.out, report)


def render(args: argparse.Namespace, rows: int, seconds: dict[str, list[float]]) -> str:
    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    base = median(seconds["no join"]) / args.messages
    lines = [f"## join_cost.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "",
             f"Command: `.venv/bin/python benchmarks/join_cost.py --messages {args.messages} "
             f"--update-every {args.update_every} --repeat {args.repeat}`  ",
             f"Machine: {machine()}; {args.messages:,} payments and {rows:,} table records, "
             f"{PARTITIONS} partitions, {KEYS:,} keys; one worker, Redis; load average at the "
             f"end {os.getloadavg()[0]:.1f}.", "",
             "| path | records/s (median) | seconds per run | us per payment over no join |",
             "|---|---:|---|---:|"]
    for name, runs in seconds.items():
        rate = args.messages / median(runs)
        extra = (median(runs) / args.messages - base) * 1e6
        lines.append(f"| {name} | {rate:,.0f} | {', '.join(f'{s:.2f}' for s in runs)} | "
                     f"{extra:.1f} |")
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
