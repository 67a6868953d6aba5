"""The pipeline thread's cost per record, in process, beside ``json.loads`` of the same values.

A worker's pipeline actor thread holds the GIL ~87% of the time on the
robots path (py-spy, see journal/2026-11-23.md), so its per-record cost bounds the
worker. This runs ``PipelineRunner.process`` (the worker's own runner) over
the robot stream in batches of 2,000 records, as ``getmany`` hands them over
(each partition's records in a run),
with every 50th batch encoding the dirty states as a snapshot would (no
store, no Kafka), and the worker's garbage-collector settings
(``runtime.worker.tune_gc``). Baseline in the same run: ``json.loads`` of each value.

``--pipeline robots_envelope`` runs the robots over the same reports copied into
envelopes (``throughput.py --format envelope``'s input and ``bench_pipelines``' pipeline),
with ``Envelope.FromString`` + ``json.loads`` of each payload as the baseline.
``--pipeline normalize`` runs the chaos topology's republisher instead (flat-map
1 -> ~3, a unit per report, or an envelope per output with ``--per-value``);
``--pipeline counting`` an aggregate feeding a republish step (no fused shape: every
record takes the general path, a plan per record). ``--pipeline windows`` the chain's
windowed aggregator (two tumbling-window stages)
over the republisher's outputs, with ``Envelope.FromString`` + ``json.loads``
of each payload (a unit's: each item's) as the baseline.

    python benchmarks/runner_cost.py [--messages 200000] [--repeat 5] [--profile]
        [--pipeline robots|robots_envelope|normalize|counting|windows] [--per-value] [--general]

``--general`` turns the fused paths off: every record takes the general path (a
pipeline's cost on both paths, for those that have a fused one: robots, windows).
``--profile`` prints cProfile's top 15 (by own time) of one pass instead.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections.abc import Callable
from operator import attrgetter

from aiokafka.structs import ConsumerRecord

from onceflow.devtools.robot_stream import generate
from onceflow.examples.robot_chain import build_counting_normalize, build_normalize, build_windows
from onceflow.examples.robots import build, count, fastenings, new_counts
from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.runtime.worker import tune_gc
from onceflow.stages.formats import ENVELOPE_MARK, json_value
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.runner import PipelineRunner

BATCH, PARTITIONS = 2000, 4
#: The records' Kafka timestamp: after the robot stream's event times (2026-01-01 on), which
#: may not lead it by more than ``onceflow.windows.max-future`` (else dead letters).
BROKER_MS = 1_800_000_000_000


PIPELINES: dict[str, Callable[[], Pipeline]] = {
    "robots": lambda: build("reports"),
    "normalize": lambda: build_normalize("reports", "normalized", unit=UNITS),
    "windows": lambda: build_windows("normalized", "redis"),
    "counting": lambda: build_counting_normalize("reports", "normalized", "redis"),
    "robots_envelope": lambda: (  # as bench_pipelines.robots_envelope
        Pipeline("robots_envelope", topics=("reports",), format="envelope")
        .map("report", json_value)
        .flat_map("fastenings", fastenings)
        .aggregate("per_robot", key=attrgetter("robot"), init=new_counts, fold=count)),
}
#: The pipelines whose input is envelopes (baseline: ``FromString`` + ``json.loads``).
ENVELOPE_INPUT = ("windows", "robots_envelope")
PIPELINE = "robots"
UNITS = True  # the normalize pipeline makes units (one record per report); see --per-value
GENERAL = False  # every record on the general path, the fused ones off (--general)


def as_records(topic: str, messages: list[tuple[bytes, bytes]],
               headers: tuple[tuple[str, bytes], ...] = ()) -> list[ConsumerRecord[bytes, bytes]]:
    out: list[ConsumerRecord[bytes, bytes]] = []
    offsets = [0] * PARTITIONS
    for key, value in messages:
        p = hash(key) % PARTITIONS
        out.append(ConsumerRecord(topic, p, offsets[p], BROKER_MS, 0, key, value,
                                  None, len(key), len(value), headers))
        offsets[p] += 1
    return out


def records(messages: int, pipeline: str) -> list[ConsumerRecord[bytes, bytes]]:
    reports = as_records("reports", generate(messages, seed=11).messages)
    if pipeline == "robots_envelope":  # each copied as a republisher writes it, one hop
        copies = [(r.key or b"", Envelope(
            key=(r.key or b"").decode(), payload=r.value, event_time_ms=BROKER_MS,
            payload_type="application/json",
            source_chain=[SourceRef(topic="raw", partition=r.partition, offset=r.offset)],
        ).SerializeToString()) for r in reports]
        return as_records("reports", copies, (ENVELOPE_MARK,))
    if pipeline != "windows":
        return reports
    runner = PipelineRunner(build_normalize("reports", "normalized", unit=UNITS),
                            lambda spec, keys: {}, "dead", load_sequences=lambda keys: {})
    outputs = runner.process(reports).outputs
    return as_records("normalized", [(o.key or b"", o.value) for o in outputs], outputs[0].headers)


def onceflow_pass(batch_list: list[list[ConsumerRecord[bytes, bytes]]]) -> None:
    runner = PipelineRunner(PIPELINES[PIPELINE](), lambda spec, keys: {}, "dead",
                            load_sequences=lambda keys: {})
    if GENERAL:
        runner._fused = {}
    for n, batch in enumerate(batch_list, 1):
        runner.process(batch)
        if n % 50 == 0:
            for table in runner.tables:
                table.take_dirty(n)
                table.written(n)


def raw_pass(batch_list: list[list[ConsumerRecord[bytes, bytes]]]) -> None:
    envelopes = PIPELINE in ENVELOPE_INPUT
    for batch in batch_list:
        for record in batch:
            if envelopes:
                envelope = Envelope.FromString(record.value or b"")
                for item in envelope.items:
                    json.loads(item.payload)
                if not envelope.items:
                    json.loads(envelope.payload)
            else:
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
    parser.add_argument("--pipeline", choices=sorted(PIPELINES), default="robots")
    parser.add_argument("--per-value", action="store_true",
                        help="normalize republishes one record per event, not one per report")
    parser.add_argument("--general", action="store_true",
                        help="every record on the general path (the fused paths off)")
    args = parser.parse_args()
    global PIPELINE, UNITS, GENERAL
    PIPELINE, UNITS, GENERAL = args.pipeline, not args.per_value, args.general
    stream = records(args.messages, args.pipeline)
    # getmany's batches: each partition's records in a run (stable: in offset order)
    batch_list = [sorted(stream[i:i + BATCH], key=attrgetter("partition"))
                  for i in range(0, len(stream), BATCH)]
    tune_gc()  # the worker's collector settings; the stream is frozen (a worker holds none)
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
    path = " (general path)" if GENERAL else ""
    print(f"{args.pipeline}{path}: {len(stream):,} records, {args.repeat} alternating passes "
          "(best of each):")
    print(f"  {'envelope + json' if PIPELINE in ENVELOPE_INPUT else 'json.loads only':25} "
          f"{r:6.2f} us/record")
    print(f"  PipelineRunner.process    {f:6.2f} us/record  ({f / r:.1f}x json.loads; "
          f"onceflow's own share {f - r:.2f} us)")
    reports = args.messages  # each input report, whatever records carry it
    print(f"  per report: {f * len(stream) / reports:6.2f} us (runner), "
          f"{r * len(stream) / reports:6.2f} us (baseline)")


if __name__ == "__main__":
    main()
