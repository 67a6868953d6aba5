"""The order the worker applied its inputs in: its merge log, up to the committed offsets.

A join, or a single worker folding several source partitions, gives results that
depend on how the inputs' partitions interleaved (``stages.merge_log``): a window
closes, a value is judged late, a stream record meets a table version, where the
worker's order put it. The worker logs that order (``<pipeline>-merge-log``) before
it applies each run, so the replay can follow it: every logged run, read from the
log's start (with ``kafka.merge_log_topic.decode_all``, a zombie's late appends
dropped as the worker's restart drops them), cut at the group's committed offsets
(runs logged past them were not committed: the worker's restart would replay
them, the replay stops before them as it stops reading there).

The replay then needs the log to cover each ordered input from its first offset to
the committed one. Where it does not (the log's head trimmed by retention, a log
begun after the input, a pipeline that needed no log before), the interleaving of
those records is unknown: ``Order.gaps`` names them, and any row that differs is
"order unknown" (exit 2), never drift.
The log is read to the high watermark of a fetch, never ListOffsets (Tansu's are
wrong), by a group-less consumer; nothing is written to it (the worker's reader
writes a mark, this one does not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer

from onceflow.kafka.merge_log_topic import decode_all, merge_log_topic, read_to_end
from onceflow.kafka.tail_reader import tail_options
from onceflow.stages.merge_log import Run, needs_merge_log, ordered_topics
from onceflow.stages.pipeline import Pipeline

__all__ = ["Order", "logged_order", "ordered_inputs", "read_merge_log"]

Input = tuple[str, int]


@dataclass(frozen=True)
class Order:
    """The runs to replay per merge log partition, and the inputs they leave unordered."""

    runs: dict[int, list[Run]]
    across: bool
    gaps: list[str] = field(default_factory=list)  # "topic/partition offsets a..b"


def ordered_inputs(pipeline: Pipeline, single_worker: bool,
                   committed: Mapping[Input, int]) -> tuple[set[str], bool] | None:
    """The topics whose partitions the worker ordered by its log, and whether in one order
    across partitions (a single worker); None when the worker keeps no log."""
    sources = sum(1 for topic, _ in committed if topic in pipeline.topics)
    if not needs_merge_log(pipeline, single_worker, sources):
        return None
    return ordered_topics(pipeline, single_worker), single_worker


def logged_order(logged: Mapping[int, list[Run]], topics: set[str], across: bool,
                 committed: Mapping[Input, int]) -> Order:
    """The logged runs of ``topics`` below the committed offsets (a run across one is cut
    there), and the stretches of input below them that no run covers."""
    runs: dict[int, list[Run]] = {}
    covered: dict[Input, list[tuple[int, int]]] = {}
    for number, found in sorted(logged.items()):
        for run in found:
            if run.topic not in topics or (run.partition is not None) != across:
                continue  # as the worker's runner: another shape of log orders nothing
            source = (run.topic, run.partition if run.partition is not None else number)
            end = committed.get(source, 0)
            if run.first >= end:
                continue
            kept = run._replace(last=min(run.last, end - 1))
            runs.setdefault(number, []).append(kept)
            covered.setdefault(source, []).append((kept.first, kept.last))
    gaps = []
    for source, end in sorted(committed.items()):
        if source[0] not in topics or end <= 0:
            continue
        at = 0
        for first, last in sorted(covered.get(source, ())):
            if first > at:
                gaps.append(f"{source[0]}/{source[1]} offsets {at}..{first - 1}")
            at = max(at, last + 1)
        if at < end:
            gaps.append(f"{source[0]}/{source[1]} offsets {at}..{end - 1}")
    return Order(runs, across, gaps)


async def read_merge_log(consumer_options: Mapping[str, Any], pipeline_id: str,
                         timeout: float) -> dict[int, list[Run]]:
    """Every run of the pipeline's merge log, per partition (empty: no log topic)."""
    topic = merge_log_topic(pipeline_id)
    options = tail_options(consumer_options)
    consumer = AIOKafkaConsumer(**options)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return {}
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
    finally:
        await consumer.stop()
    read = await read_to_end(options, topic, partitions, timeout)
    return {p: decode_all(records) for p, (records, _) in read.items()}
