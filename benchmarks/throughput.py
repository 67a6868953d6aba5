"""Throughput of onceflow's full path beside a raw aiokafka loop, same topic, same run.

Full path: consume -> parse the plain JSON value -> producer-sequence dedup
on (serial, seq) -> flat-map -> aggregate (replay check + fold) -> Redis
persist -> commit, as a real ``onceflow run`` worker process. Baseline: a
plain aiokafka ``getmany`` loop parsing the same JSON values
(``json.loads``), in its own process. Both read the same topic on the same broker.
Rates count input records from the moment each consumer had its partitions
(onceflow: its "partitions assigned" log line; baseline: its first record)
until the last record was processed (onceflow: committed offsets reached the
end, read from the producer's acks). Peak RSS is sampled with psutil.

    python benchmarks/throughput.py [--messages 300000] [--repeat 3] [--store redis|cassandra]
        [--profile DIR]

``--profile DIR`` samples the worker with py-spy (``DIR/worker-<n>.txt``,
collapsed stacks; ``benchmarks/profile_top.py`` turns them into a top-N).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
from aiokafka import AIOKafkaConsumer

from onceflow.devtools import services
from onceflow.devtools.chaos import start_store
from onceflow.devtools.harness import packaged_config, worker_command
from onceflow.devtools.robot_stream import generate

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "integration"))
from common import CommitWatcher, append, journal_page  # noqa: E402
from helpers import create_topic, produce  # noqa: E402

PARTITIONS = 4
EXTRA = [a for kv in os.environ.get("BENCH_SET", "").split() for a in ("--set", kv)]


def raw_child(bootstrap: str, topic: str, expected: int) -> None:
    """The baseline: getmany + ``json.loads`` of each value, nothing else."""

    async def run() -> dict[str, float]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                    group_id=f"raw-{time.monotonic_ns()}",
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=6000, heartbeat_interval_ms=2000,
                                    max_poll_records=2000)
        await consumer.start()
        seen = events = 0
        first = 0.0
        try:
            while seen < expected:
                for records in (await consumer.getmany(timeout_ms=500, max_records=2000)).values():
                    if not first:
                        first = time.monotonic()
                    for record in records:
                        report = json.loads(record.value)
                        events += len(report["results"])
                    seen += len(records)
            return {"records": seen, "events": events, "seconds": time.monotonic() - first}
        finally:
            await consumer.stop()

    print(json.dumps(asyncio.run(run())))


def peak_rss_while(proc: subprocess.Popen[bytes], until: callable) -> tuple[float, int]:  # type: ignore[valid-type]
    """Poll until ``until()`` is true or the process exits; returns (end time, peak RSS)."""
    ps = psutil.Process(proc.pid)
    peak = 0
    while True:
        with contextlib.suppress(psutil.NoSuchProcess):
            peak = max(peak, ps.memory_info().rss)
        if until() or proc.poll() is not None:
            return time.monotonic(), peak
        time.sleep(0.02)


def measure_raw(bootstrap: str, topic: str, expected: int) -> dict[str, float]:
    proc = subprocess.Popen([sys.executable, __file__, "raw-child", bootstrap, topic,
                             str(expected)], stdout=subprocess.PIPE)
    _, peak = peak_rss_while(proc, lambda: False)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("raw baseline failed")
    result: dict[str, float] = json.loads(out)
    result["peak_rss_mb"] = peak / 2**20
    return result


def measure_onceflow(bootstrap: str, store: dict[str, str], topic: str, ends: dict[int, int],
                     events: int, workdir: Path, profile: Path | None = None
                     ) -> dict[str, float]:
    group = f"bench-{topic}-{time.monotonic_ns()}"
    settings = {"onceflow.kafka.bootstrap-servers": bootstrap, "onceflow.kafka.group-id": group,
                **{k: v.replace("{group}", group) for k, v in store.items() if k != "kind"}}
    argv = worker_command(packaged_config("demo.conf"), settings)
    argv += [*EXTRA, "--set", "onceflow.persistence.interval=250ms",
             "--set", "onceflow.commit.interval=250ms"]
    log = workdir / "worker.log"
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic, "ONCEFLOW_ROBOTS_STORE": store["kind"]}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    total = sum(ends.values())
    spy = None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        out_file = profile / f"worker-{len(list(profile.glob('worker-*.txt'))) + 1}.txt"
        spy = subprocess.Popen(  # --gil: only the thread holding the GIL (the CPU cost)
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(proc.pid),
             "--rate", "200", "--format", "raw", "--threads", "--gil", "--output", str(out_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = CommitWatcher(bootstrap, group, topic, ends)
    _, peak = peak_rss_while(proc, lambda: watcher.committed() >= total)
    end_wall = time.time()
    watcher.close()
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its samples on Ctrl-C
        spy.wait(30)
    proc.terminate()
    proc.wait(15)
    text = log.read_text()
    match = re.search(r"^(\S+ \S+) INFO onceflow.actors.\S+: partitions assigned", text, re.M)
    if not match:
        raise RuntimeError(f"no assignment in worker log:\n{text[-2000:]}")
    assigned = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    seconds = end_wall - assigned
    return {"records": total, "events": events, "seconds": seconds, "peak_rss_mb": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each path")
    parser.add_argument("--store", choices=("redis", "cassandra"), default="redis")
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    parser.add_argument("--profile", type=Path, help="py-spy the worker into this folder")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="onceflow-bench-"))
    kafka = services.start_tansu(state / "kafka")
    # Redis keys are prefixed per run's group; Cassandra gets one keyspace.
    namespace = "{group}" if args.store == "redis" else f"bench{int(time.time())}"
    db, store = start_store(args.store, state, namespace)
    store["kind"] = args.store
    runs: list[tuple[dict[str, float], dict[str, float]]] = []
    try:
        topic = f"bench-{int(time.time())}"
        create_topic(kafka.address, topic, PARTITIONS)
        stream = generate(args.messages, seed=11)
        ends = produce(kafka.address, topic, stream.messages)
        for _ in range(args.repeat):
            raw = measure_raw(kafka.address, topic, args.messages)
            full = measure_onceflow(kafka.address, store, topic, ends, stream.events, state,
                                    args.profile)
            runs.append((raw, full))
    finally:
        services.stop(kafka)
        services.stop(db)
    report = render(args, stream.events, runs)
    print(report)
    if args.profile:  # sampled runs are slower: print, do not record
        return
    append(args.out, report)


def render(args: argparse.Namespace, events: int,
           runs: list[tuple[dict[str, float], dict[str, float]]]) -> str:
    def rate(m: dict[str, float], what: str = "records") -> float:
        return m[what] / m["seconds"]

    ratios = sorted(rate(full) / rate(raw) for raw, full in runs)
    lines = [
        f"## throughput.py --store {args.store}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/throughput.py --messages {args.messages} "
        f"--repeat {args.repeat} --store {args.store}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; Tansu broker and "
        f"{args.store} started by the benchmark; {args.messages:,} plain JSON records ({events:,} "
        f"fastening events), {PARTITIONS} partitions, 1,000 keys (robots, each its own "
        "producer for the sequence dedup); runs alternate raw / onceflow.",
        "",
        "| run | path | records/s | events/s | seconds | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for n, (raw, full) in enumerate(runs, 1):
        for name, m in (("raw aiokafka getmany + json.loads", raw),
                        (f"onceflow full path (json, sequence dedup, flat-map, aggregate, "
                         f"{args.store} persist, commit)", full)):
            lines.append(f"| {n} | {name} | {rate(m):,.0f} | {rate(m, 'events'):,.0f} | "
                         f"{m['seconds']:.2f} | {m['peak_rss_mb']:.0f} |")
    median = ratios[len(ratios) // 2]
    lines += ["", f"**Ratio onceflow / raw: median {median:.2f}** "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-child":
        raw_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
