"""Throughput of onceflow's full path beside a raw aiokafka loop, same topic, same run.

Full path: consume -> parse the plain JSON value -> producer-sequence dedup
on (serial, seq) -> flat-map -> aggregate (replay check + fold) -> Redis
persist -> commit, as a real ``onceflow run`` worker process. Baseline: a
plain aiokafka ``getmany`` loop parsing the same JSON values
(``json.loads``), in its own process. Both read the same topic on the same broker.

``--format envelope``: the same reports copied into onceflow envelopes, as a
republisher writes them (JSON payload, a one-hop source chain rooted at the
report's partition and offset in a raw topic, the ``onceflow-format`` header),
read by ``bench_pipelines:robots_envelope`` (its envelope head, then the same
steps; the chain's root dedups instead of the producer sequences). Baseline:
``getmany`` + ``Envelope.FromString`` + ``json.loads`` of the payload.
Rates count input records from the moment each consumer had its partitions
(onceflow: its "partitions assigned" log line; baseline: its first record)
until the last record was processed (onceflow: committed offsets reached the
end, read from the producer's acks). Peak RSS is sampled with psutil.

    python benchmarks/throughput.py [--messages 300000] [--repeat 3] [--store redis|cassandra]
        [--format json|envelope] [--profile DIR]

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
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaProducer

from onceflow.devtools import services
from onceflow.devtools.chaos import start_store
from onceflow.devtools.harness import packaged_config, worker_command
from onceflow.devtools.robot_stream import START_MS, generate
from onceflow.kafka.producer import key_partition
from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.stages.formats import ENVELOPE_MARK

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "integration"))
from common import (  # noqa: E402
    CommitWatcher,
    append,
    assignments_in,
    journal_page,
    raw_consume,
    worker_cwd,
    worker_path,
)
from helpers import create_topic  # noqa: E402

PARTITIONS = 4
EXTRA = [a for kv in os.environ.get("BENCH_SET", "").split() for a in ("--set", kv)]


def raw_child(bootstrap: str, topic: str, expected: int, fmt: str = "json") -> None:
    """The baseline: getmany + ``json.loads`` of each value (of each envelope's payload,
    parsed by ``Envelope.FromString``), nothing else."""
    envelopes = fmt == "envelope"

    def handle(records: list[Any]) -> int:
        events = 0
        for record in records:
            value = record.value
            if envelopes:
                value = Envelope.FromString(value).payload
            events += len(json.loads(value)["results"])
        return events

    print(json.dumps(asyncio.run(raw_consume(bootstrap, topic, expected, handle))))


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]],
                  headers: list[tuple[str, bytes]]) -> dict[int, int]:
    """Produce in order, as ``devtools.harness.produce`` does (its batching), with
    ``headers`` on each record; end offsets from the acks."""
    ends: dict[int, int] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=5)
    await producer.start()
    try:
        for start in range(0, len(messages), 20_000):
            acks = [await producer.send(topic, value, key=key, headers=headers or None)
                    for key, value in messages[start:start + 20_000]]
            for meta in await asyncio.gather(*acks):
                ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    finally:
        await producer.stop()
    return ends


def as_envelopes(topic: str, messages: list[tuple[bytes, bytes]]
                 ) -> list[tuple[bytes, bytes]]:
    """The reports as a republisher preserving their partitions writes them: each report's
    envelope rooted at its partition and offset in the raw topic ``topic-raw``."""
    raw = f"{topic}-raw"
    partitions = list(range(PARTITIONS))
    offsets = [0] * PARTITIONS
    out = []
    for key, value in messages:
        partition = key_partition(key, partitions)
        offset = offsets[partition]
        offsets[partition] += 1
        envelope = Envelope(event_id=f"{raw}/{partition}/{offset}.0", event_time_ms=START_MS,
                            key=key.decode(), payload=value, payload_type="application/json",
                            source_chain=[SourceRef(topic=raw, partition=partition,
                                                    offset=offset, index=0)])
        out.append((key, envelope.SerializeToString()))
    return out


def peak_rss_while(proc: subprocess.Popen[bytes], until: Callable[[], bool]
                   ) -> tuple[float, int]:
    """Poll until ``until()`` is true or the process exits; returns (end time, peak RSS)."""
    ps = psutil.Process(proc.pid)
    peak = 0
    while True:
        with contextlib.suppress(psutil.NoSuchProcess):
            peak = max(peak, ps.memory_info().rss)
        if until() or proc.poll() is not None:
            return time.monotonic(), peak
        time.sleep(0.02)


def measure_raw(bootstrap: str, topic: str, expected: int, fmt: str) -> dict[str, float]:
    proc = subprocess.Popen([sys.executable, __file__, "raw-child", bootstrap, topic,
                             str(expected), fmt], stdout=subprocess.PIPE)
    _, peak = peak_rss_while(proc, lambda: False)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("raw baseline failed")
    result: dict[str, float] = json.loads(out)
    result["peak_rss_mb"] = peak / 2**20
    return result


def measure_onceflow(bootstrap: str, store: dict[str, str], topic: str, ends: dict[int, int],
                     events: int, workdir: Path, profile: Path | None = None,
                     pipeline: str | None = None) -> dict[str, float]:
    """One ``onceflow run`` worker (demo.conf's robots, or ``pipeline`` of
    ``bench_pipelines``, reading ``topic``) until every record is committed."""
    group = f"bench-{topic}-{time.monotonic_ns()}"
    settings = {"onceflow.kafka.bootstrap-servers": bootstrap, "onceflow.kafka.group-id": group,
                **{k: v.replace("{group}", group) for k, v in store.items() if k != "kind"}}
    if pipeline is not None:
        settings["onceflow.pipeline"] = f"bench_pipelines:{pipeline}"
    argv = worker_command(packaged_config("demo.conf"), settings)
    argv += [*EXTRA, "--set", "onceflow.persistence.interval=250ms",
             "--set", "onceflow.commit.interval=250ms"]
    log = workdir / "worker.log"
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic, "ONCEFLOW_ROBOTS_STORE": store["kind"],
           "BENCH_TOPIC": topic, "PYTHONPATH": worker_path(os.environ)}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=worker_cwd(os.environ), stdout=out,
                                stderr=subprocess.STDOUT)
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
    assigned = assignments_in(text)
    if not assigned:
        raise RuntimeError(f"no assignment in worker log:\n{text[-2000:]}")
    seconds = end_wall - assigned[0][0]
    folded = re.findall(r"'\w+\.folded': (\d+)", text)  # the stats lines: the last one's
    return {"records": total, "events": events, "seconds": seconds, "peak_rss_mb": peak / 2**20,
            "folded": int(folded[-1]) if folded else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each path")
    parser.add_argument("--store", choices=("redis", "cassandra"), default="redis")
    parser.add_argument("--format", choices=("json", "envelope"), default="json",
                        help="the input: plain JSON reports, or copied into envelopes")
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
        envelopes = args.format == "envelope"
        messages = as_envelopes(topic, stream.messages) if envelopes else stream.messages
        headers = [ENVELOPE_MARK] if envelopes else []
        ends = asyncio.run(produce(kafka.address, topic, messages, headers))
        del messages
        for _ in range(args.repeat):
            raw = measure_raw(kafka.address, topic, args.messages, args.format)
            full = measure_onceflow(kafka.address, store, topic, ends, stream.events, state,
                                    args.profile, "robots_envelope" if envelopes else None)
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
    envelopes = args.format == "envelope"
    option = " --format envelope" if envelopes else ""
    records = ("records copied into envelopes (JSON payload, one-hop source chain)"
               if envelopes else "plain JSON records")
    dedup = ("the chain's root for dedup" if envelopes
             else "each its own producer for the sequence dedup")
    lines = [
        f"## throughput.py --store {args.store}{option}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/throughput.py --messages {args.messages} "
        f"--repeat {args.repeat} --store {args.store}{option}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; Tansu broker and "
        f"{args.store} started by the benchmark; {args.messages:,} {records} ({events:,} "
        f"fastening events), {PARTITIONS} partitions, 1,000 keys (robots, {dedup}); runs "
        f"alternate raw / onceflow; load average at the end {os.getloadavg()[0]:.1f}.",
        "",
        "| run | path | records/s | events/s | seconds | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    raw_name = ("raw aiokafka getmany + Envelope.FromString + json.loads of the payload"
                if envelopes else "raw aiokafka getmany + json.loads")
    full_name = (f"onceflow full path (envelope, map json_value, flat-map, aggregate, "
                 f"{args.store} persist, commit)" if envelopes else
                 f"onceflow full path (json, sequence dedup, flat-map, aggregate, "
                 f"{args.store} persist, commit)")
    for n, (raw, full) in enumerate(runs, 1):
        for name, m in ((raw_name, raw), (full_name, full)):
            lines.append(f"| {n} | {name} | {rate(m):,.0f} | {rate(m, 'events'):,.0f} | "
                         f"{m['seconds']:.2f} | {m['peak_rss_mb']:.0f} |")
    median = ratios[len(ratios) // 2]
    folded = ", ".join(f"{full['folded']:,}" for _, full in runs)
    lines += ["", f"**Ratio onceflow / raw: median {median:.2f}** "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})", "",
              f"Values folded by each onceflow run (its last periodic stats line, which may lag "
              f"the end): {folded} "
              f"(expected {events:,}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-child":
        raw_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
