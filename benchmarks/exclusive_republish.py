"""The exclusive republisher beside a hand-written consume-produce loop, and its tail read.

Throughput: the same plain JSON input (``{"id": i, "parts": 3}``, 4
partitions) through (a) a raw aiokafka loop that consumes a batch, produces
each item's 3 parts as plain JSON to the same partition number of its own
output topic, awaits the sends and commits (an at-least-once republisher
written by hand), and (b) an ``onceflow run`` worker running
``onceflow.examples.mirror:mirror_plain`` (exclusive republish, plain JSON
outputs with origin headers, commit after the acks). Rates count input
records from assignment (onceflow: its "partitions assigned" log line; raw:
its first record) until the last input is committed.

Tail read: one output partition holding ``--tail-records`` plain outputs of
one input partition, read back by the worker's ``TailReader`` as at an
assignment: once with the input committed one commit interval (2,000
inputs) before the end, the normal case, and once with nothing committed
(a worker killed before its first commit: the whole partition).

    python benchmarks/exclusive_republish.py [--messages 100000] [--repeat 3]
        [--tail-records 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer
from common import append, journal_page, raw_republish

from onceflow.devtools import harness, services
from onceflow.devtools.chaos import start_store
from onceflow.kafka.tail_reader import TailReader
from onceflow.protos.envelope_pb2 import SourceRef
from onceflow.stages.origin import plain_headers

PARTITIONS = 4
PARTS = 3
COMMIT_INTERVAL_INPUTS = 2_000


def raw_child(bootstrap: str, topic: str, output: str, expected: int) -> None:
    """The baseline (``common.raw_republish``), parts to the input's partition number."""
    print(json.dumps(asyncio.run(raw_republish(bootstrap, topic, output, expected,
                                               same_partition=True))))


def measure_raw(bootstrap: str, topic: str, expected: int) -> dict[str, float]:
    output = f"{topic}-raw-{time.monotonic_ns()}"
    asyncio.run(harness.create_topic(bootstrap, output, PARTITIONS))
    out = subprocess.run([sys.executable, __file__, "raw-child", bootstrap, topic, output,
                          str(expected)], capture_output=True, check=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def measure_onceflow(bootstrap: str, store: dict[str, str], topic: str, ends: dict[int, int],
                     workdir: Path) -> dict[str, float]:
    group = f"bench-{time.monotonic_ns()}"
    output = f"{topic}-out-{time.monotonic_ns()}"
    asyncio.run(harness.create_topic(bootstrap, output, PARTITIONS))
    settings = {"onceflow.pipeline": "onceflow.examples.mirror:mirror_plain",
                "onceflow.kafka.bootstrap-servers": bootstrap, "onceflow.kafka.group-id": group,
                "onceflow.persistence.interval": "250ms", "onceflow.commit.interval": "250ms",
                **store}
    env = {**os.environ, "ONCEFLOW_MIRROR_TOPIC": topic, "ONCEFLOW_MIRROR_OUTPUT": output}
    worker = harness.WorkerProcess(
        harness.worker_command(harness.packaged_config("demo.conf"), settings), env, workdir,
        "bench-exclusive")

    async def run() -> float:
        worker.start()
        async with harness.CommittedOffsets(bootstrap, group) as committed:
            if not await committed.wait_for(topic, ends, 600, worker):
                raise RuntimeError(f"the worker never caught up; see {worker.logs[-1]}")
        return time.time()

    done = asyncio.run(run())
    worker.terminate(timeout=15)
    text = worker.logs[-1].read_text()
    match = re.search(r"^(\S+ \S+) INFO onceflow.kafka.\S+: partitions assigned", text, re.M)
    if not match:
        raise RuntimeError(f"no assignment in worker log:\n{text[-2000:]}")
    assigned = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return {"records": sum(ends.values()), "seconds": done - assigned}


async def fill_tail(bootstrap: str, source: str, output: str, outputs: int) -> int:
    """``outputs`` plain outputs of input partition ``source``/0 in ``output``/0; inputs used."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                max_batch_size=262_144)
    await producer.start()
    try:
        pending = []
        for n in range(outputs):
            offset, index = divmod(n, PARTS)
            chain = [SourceRef(topic=source, partition=0, offset=offset, index=index)]
            headers = [("onceflow-format", b"json"),
                       *plain_headers(chain, f"{source}/0/{offset}/{index}", 0)]
            pending.append(await producer.send(output, b'{"id":0,"part":0}', partition=0,
                                               headers=headers))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return -(-outputs // PARTS)


async def time_tail(bootstrap: str, source: str, output: str, committed: int
                    ) -> tuple[float, dict[str, object]]:
    reader = TailReader({"bootstrap_servers": bootstrap, "enable_auto_commit": False,
                         "auto_offset_reset": "earliest", "fetch_max_wait_ms": 100}, 600.0)
    started = time.monotonic()
    found = await reader.written({(output, 0): {(source, 0): committed}}, {})
    return time.monotonic() - started, {"written": found[(output, 0)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tail-records", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-exclusive-bench-"))
    kafka = services.start_tansu(state / "kafka")
    db, store = start_store("redis", state, f"bench{int(time.time())}")
    runs = []
    try:
        topic = f"items-{int(time.time())}"
        asyncio.run(harness.create_topic(kafka.address, topic, PARTITIONS))
        items = [(str(i).encode(), json.dumps({"id": i, "parts": PARTS}).encode())
                 for i in range(args.messages)]
        produced = asyncio.run(harness.produce(kafka.address, topic, items))
        ends = {p: produced.get(p, 0) for p in range(PARTITIONS)}
        for _ in range(args.repeat):
            runs.append((measure_raw(kafka.address, topic, args.messages),
                         measure_onceflow(kafka.address, store, topic, ends, state)))
        tail_topic = f"tail-{int(time.time())}"
        asyncio.run(harness.create_topic(kafka.address, tail_topic, 1))
        inputs = asyncio.run(fill_tail(kafka.address, "items-in", tail_topic, args.tail_records))
        tails = [(label, *asyncio.run(time_tail(kafka.address, "items-in", tail_topic, at)))
                 for label, at in (("committed one commit interval before the end",
                                    inputs - COMMIT_INTERVAL_INPUTS),
                                   ("nothing committed (the whole partition)", 0))]
    finally:
        services.stop(kafka)
        services.stop(db)
    report = render(args, runs, tails)
    print(report)
    append(args.out, report)


def render(args: argparse.Namespace, runs: list[tuple[dict[str, float], dict[str, float]]],
           tails: list[tuple[str, float, dict[str, object]]]) -> str:
    def rate(m: dict[str, float]) -> float:
        return m["records"] / m["seconds"]

    ratios = sorted(rate(full) / rate(raw) for raw, full in runs)
    lines = [
        f"## exclusive_republish.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/exclusive_republish.py --messages "
        f"{args.messages} --repeat {args.repeat} --tail-records {args.tail_records}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; Tansu and Redis "
        f"started by the benchmark; {args.messages:,} plain JSON items, {PARTITIONS} "
        f"partitions, {PARTS} outputs each; runs alternate raw / onceflow.",
        "",
        "| run | path | input records/s | seconds |",
        "|---|---|---:|---:|",
    ]
    for n, (raw, full) in enumerate(runs, 1):
        for name, m in (("raw aiokafka consume, produce, await sends, commit", raw),
                        ("onceflow exclusive republish (plain JSON, commit after acks)", full)):
            lines.append(f"| {n} | {name} | {rate(m):,.0f} | {m['seconds']:.2f} |")
    median = ratios[len(ratios) // 2]
    lines += ["", f"**Ratio onceflow / raw: median {median:.2f}** "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})", "",
              f"Tail read at assignment, one output partition of {args.tail_records:,} records:",
              "", "| case | seconds | found |", "|---|---:|---|"]
    for label, seconds, found in tails:
        lines.append(f"| {label} | {seconds:.2f} | {found['written']} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-child":
        raw_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
