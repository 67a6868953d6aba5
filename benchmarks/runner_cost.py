"""The pipeline thread's cost per record, in process, beside ``json.loads`` of the same values.

A worker's pipeline actor thread holds the GIL ~87% of the time on the
robots path (py-spy, see RESULTS.md), so its per-record cost bounds the
worker. This runs ``PipelineRunner.process`` (the worker's own runner) over
the robot stream in batches of 2,000 records, as ``getmany`` hands them over,
with every 50th batch encoding the dirty states as a snapshot would (no
store, no Kafka). Baseline in the same run: ``json.loads`` of each value.

    python benchmarks/runner_cost.py [--messages 200000] [--repeat 5] [--profile]

``--profile`` prints cProfile's top 15 (by own time) of one pass instead.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections.abc import Callable

from aiokafka.structs import ConsumerRecord

from onceflow.devtools.robot_stream import generate
from onceflow.examples.robots import build
from onceflow.stages.runner import PipelineRunner

BATCH, PARTITIONS = 2000, 4


def records(messages: int) -> list[ConsumerRecord[bytes, bytes]]:
    stream = generate(messages, seed=11)
    out: list[ConsumerRecord[bytes, bytes]] = []
    offsets = [0] * PARTITIONS
    for key, value in stream.messages:
        p = hash(key) % PARTITIONS
        out.append(ConsumerRecord("reports", p, offsets[p], 1_700_000_000_000, 0, key, value,
                                  None, len(key), len(value), ()))
        offsets[p] += 1
    return out


def onceflow_pass(batch_list: list[list[ConsumerRecord[bytes, bytes]]]) -> None:
    runner = PipelineRunner(build("reports"), lambda spec, keys: {}, "dead",
                            load_sequences=lambda keys: {})
    for n, batch in enumerate(batch_list, 1):
        runner.process(batch)
        if n % 50 == 0:
            for table in runner.tables:
                table.take_dirty(n)
                table.written(n)


def raw_pass(batch_list: list[list[ConsumerRecord[bytes, bytes]]]) -> None:
    for batch in batch_list:
        for record in batch:
            json.loads(record.value or b"")


def timed(fn: Callable[[list[list[ConsumerRecord[bytes, bytes]]]], None],
          batch_list: list[list[ConsumerRecord[bytes, bytes]]]) -> float:
    start = time.perf_counter()
    fn(batch_list)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    stream = records(args.messages)
    batch_list = [stream[i:i + BATCH] for i in range(0, len(stream), BATCH)]
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(onceflow_pass, batch_list)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
        return
    raw, full = [], []
    for _ in range(args.repeat):
        raw.append(timed(raw_pass, batch_list) / len(stream) * 1e6)
        full.append(timed(onceflow_pass, batch_list) / len(stream) * 1e6)
    r, f = min(raw), min(full)  # best of N: the least disturbed pass (as timeit does)
    print(f"{len(stream):,} records, {args.repeat} alternating passes (best of each):")
    print(f"  json.loads only           {r:6.2f} us/record")
    print(f"  PipelineRunner.process    {f:6.2f} us/record  ({f / r:.1f}x json.loads; "
          f"onceflow's own share {f - r:.2f} us)")


if __name__ == "__main__":
    main()
