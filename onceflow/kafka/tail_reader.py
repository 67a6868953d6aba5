"""Reads the tails of exclusive republish outputs on assignment (the Kafka side of
``onceflow.stages.tail_scan``).

Runs on the consumer's loop inside the assignment callback, while the new
partitions are still paused: first everything processed so far is settled
(a flush), then per output partition the records the producer still holds
for it (unacknowledged, or adopted from the outbox: they reach the broker
before anything newer, so they count as written), then the partition is read
backwards in chunks from its high watermark, which a fetch reports (never
ListOffsets, wrong on some brokers for multi-record batches). The pipeline
actor gets the marks before any record of those partitions is fetched.

The dead-letter topic (and the late-events topic of a pipeline with windows)
is resumed the same way (``onceflow.stages.side_outputs``): its partition
count is read first, and the pipeline actor learns it with the marks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition

from onceflow.actors.base import FatalHandler
from onceflow.actors.messages import Flush, Mailbox, PipelineMessage, ResumeOutputs
from onceflow.stages.outcome import ConsumedHeader, Output
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.side_outputs import LateFound, SideOrigin, late_value, side_partition
from onceflow.stages.state import TopicPartition
from onceflow.stages.tail_scan import LogOrigin, TailScan, Written, windows, written_origin

if TYPE_CHECKING:
    from onceflow.kafka.producer import ProducerActor

log = logging.getLogger(__name__)

CHUNK = 2000  # records read per step backwards


class ExclusiveSetupError(RuntimeError):
    """An exclusive output cannot be resumed: its topic or partition is missing."""


@dataclass(frozen=True)
class ExclusiveOutput:
    """An exclusive republish step as the consumer sees it."""

    step_id: str
    topic: str
    inputs: tuple[str, ...]  # the topics its input records are consumed from
    partition_of: Callable[[str, int], int | None]
    origin: LogOrigin = written_origin
    side: bool = False  # dead letters or late events: partition_of set once the count is read

    def spread_over(self, partitions: int) -> ExclusiveOutput:
        """A side output with its partition map: input partition mod ``partitions``."""
        return replace(self, partition_of=lambda _, p: side_partition(p, partitions))

    def plan(self, positions: Mapping[TopicPartition, int]
             ) -> dict[TopicPartition, dict[TopicPartition, int]]:
        """Output partition -> the assigned input partitions mapped there, with the
        offsets their replays start at."""
        plan: dict[TopicPartition, dict[TopicPartition, int]] = {}
        for (topic, partition), start in sorted(positions.items()):
            if topic in self.inputs:
                out = self.partition_of(topic, partition)
                assert out is not None  # exclusive steps always map partitions
                plan.setdefault((self.topic, out), {})[(topic, partition)] = start
        return plan


def resumed_outputs(pipeline: Pipeline, dead_letter_topic: str, late_events_topic: str
                    ) -> tuple[ExclusiveOutput, ...]:
    """What a worker reads on assignment: its exclusive republish steps' outputs, then the
    side outputs."""
    return (*exclusive_outputs(pipeline),
            *side_outputs(pipeline, dead_letter_topic, late_events_topic))


def exclusive_outputs(pipeline: Pipeline) -> tuple[ExclusiveOutput, ...]:
    return tuple(ExclusiveOutput(step.id, step.topic, inputs, step.partition_of)
                 for step, inputs in pipeline.exclusive_outputs)


def side_outputs(pipeline: Pipeline, dead_letter_topic: str, late_events_topic: str
                 ) -> tuple[ExclusiveOutput, ...]:
    """The dead-letter topic, and the late-events topic if an aggregate has a window."""
    topics = {dead_letter_topic: "dead-letters"}
    if any(spec.window is not None for spec in pipeline.aggregates):
        topics.setdefault(late_events_topic, "late-events")
    origin = SideOrigin(pipeline.id)
    return tuple(ExclusiveOutput(name, topic, pipeline.consumed_topics, _unmapped, origin, True)
                 for topic, name in topics.items())


def _unmapped(topic: str, partition: int) -> int | None:
    raise AssertionError("a side output's partitions are known only once read")


async def fetched_high_watermarks(options: Mapping[str, Any],
                                  starts: Mapping[KafkaPartition, int | None],
                                  timeout: float) -> dict[KafkaPartition, int]:
    """Each partition's high watermark from fetches at ``starts`` (None: 0), all at once (an
    idle partition answers only after the fetch wait: one wait, not one per partition).
    Never ListOffsets, which some brokers (Tansu) answer wrongly for multi-record batches.

    A consumer of its own: aiokafka's consumer hung (in ``stop``) after one that fetched
    several partitions was re-assigned to one of them.
    """
    if not starts:
        return {}
    consumer = AIOKafkaConsumer(**options)
    await consumer.start()
    try:
        consumer.assign(list(starts))
        for tp, offset in starts.items():
            consumer.seek(tp, offset or 0)
        await fetch_until_answered(consumer, list(starts),
                                   lambda tp: consumer.highwater(tp) is not None, timeout)
        return {tp: int(consumer.highwater(tp)) for tp in starts}
    finally:
        await consumer.stop()


async def fetch_until_answered(consumer: AIOKafkaConsumer, tps: Sequence[KafkaPartition],
                               answered: Callable[[KafkaPartition], bool],
                               timeout: float) -> None:
    """Fetch the partitions not ``answered`` yet until each is, or TimeoutError naming
    them after ``timeout`` s (one record at most each: the answer is the high watermark)."""
    deadline = time.monotonic() + timeout
    while missing := [tp for tp in tps if not answered(tp)]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no fetch answer for {missing[0].topic}"
                               f"{sorted(tp.partition for tp in missing)} within "
                               f"{timeout:g}s")
        await consumer.getmany(*missing, timeout_ms=100, max_records=1)


def tail_options(consumer_options: Mapping[str, Any]) -> dict[str, Any]:
    """A group-less reader on the same cluster as the worker's consumer."""
    keep = ("bootstrap_servers", "client_id", "request_timeout_ms", "security_protocol",
            "ssl_context", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
    return {**{k: v for k, v in consumer_options.items() if k in keep},
            "enable_auto_commit": False, "auto_offset_reset": "earliest",
            "fetch_max_wait_ms": 100}


class TailReader:
    """One group-less consumer reading output partitions backwards."""

    def __init__(self, options: Mapping[str, Any], timeout: float, chunk: int = CHUNK):
        self._options = dict(options)
        self._timeout = timeout
        self._chunk = chunk

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """How many partitions each of ``topics`` has; a topic that does not exist is left
        out (asking for all topics never makes a broker create one)."""
        consumer = AIOKafkaConsumer(**self._options)
        await consumer.start()
        try:
            known = await consumer.topics()
            return {topic: len(consumer.partitions_for_topic(topic) or ())
                    for topic in topics if topic in known}
        finally:
            await consumer.stop()

    async def written(self, out: ExclusiveOutput,
                      plan: Mapping[TopicPartition, Mapping[TopicPartition, int]],
                      pending: Mapping[TopicPartition, Sequence[Output]],
                      generations: Mapping[TopicPartition, int] | None = None,
                      ) -> dict[TopicPartition, tuple[Written, LateFound]]:
        """Per output partition of ``plan``: what its input partitions already have there,
        and for a side output the late events past their committed offsets. Positions are
        read in the input logs' ``generations`` (``written_origin``, ``SideOrigin``): what
        was written from a log before its forget is older than anything of the new one."""
        origin = partial(out.origin, generations=generations) if generations else out.origin
        consumer = AIOKafkaConsumer(**self._options)
        await consumer.start()
        try:
            known = await consumer.topics()
            for (topic, partition), committed in plan.items():
                partitions = consumer.partitions_for_topic(topic) if topic in known else None
                if not partitions or partition not in partitions:
                    raise ExclusiveSetupError(
                        f"exclusive republish topic {topic!r} has no partition {partition} "
                        f"(it has {len(partitions or ())}) for input partitions "
                        f"{sorted(committed)}: create the topic with enough partitions, or "
                        "give the step a partition map that stays within it")
            highs = await self._high_watermarks([KafkaPartition(*tp) for tp in plan])
            found = {}
            for (topic, partition), committed in plan.items():
                scan = TailScan(committed, origin,
                                late_of=late_value if out.side else None)
                scan.feed((o.value, o.headers) for o in pending.get((topic, partition), ()))
                tp = KafkaPartition(topic, partition)
                read = await self._scan(consumer, tp, highs[tp], scan)
                found[(topic, partition)] = scan.written, scan.late
                log.info("%s output %s[%d]: read %d records back; replays from %s skip up to "
                         "%s%s", "side" if out.side else "exclusive", topic, partition, read,
                         dict(committed), scan.written,
                         f" and route late again the values of {sum(map(len, scan.late.values()))}"
                         " records" if scan.late else "")
            return found
        finally:
            await consumer.stop()

    async def _scan(self, consumer: AIOKafkaConsumer, tp: KafkaPartition, high: int,
                    scan: TailScan) -> int:
        """Feed ``scan`` chunks from ``high`` backwards until it is done; records read."""
        if high == 0:
            return 0
        consumer.assign([tp])
        read = 0
        for start, end in windows(0, high, self._chunk):
            if scan.done:
                break
            records = await self._read(consumer, tp, start, end)
            if not records:
                break  # the start of the log (or nothing onceflow wrote below)
            read += len(records)
            scan.feed(records)
        return read

    async def _high_watermarks(self, tps: Sequence[KafkaPartition]
                               ) -> dict[KafkaPartition, int]:
        return await fetched_high_watermarks(self._options, dict.fromkeys(tps, 0), self._timeout)

    async def _read(self, consumer: AIOKafkaConsumer, tp: KafkaPartition, start: int, end: int
                    ) -> list[tuple[bytes | None, Sequence[ConsumedHeader]]]:
        """The records at offsets [start, end)."""
        consumer.seek(tp, start)
        records: list[tuple[bytes | None, Sequence[ConsumedHeader]]] = []
        deadline = time.monotonic() + self._timeout
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {tp.topic}[{tp.partition}] {start}..{end} took "
                                   f"over {self._timeout:g}s")
            batch = await consumer.getmany(tp, timeout_ms=100, max_records=end - start)
            records += [(r.value, r.headers) for r in batch.get(tp, ()) if r.offset < end]
        return records


class ExclusiveResume:
    """The consumer's step on assignment for a pipeline with exclusive republish steps."""

    def __init__(self, outputs: Sequence[ExclusiveOutput], reader: TailReader,
                 pipeline: Mailbox[PipelineMessage], producer: ProducerActor,
                 on_fatal: FatalHandler):
        self._outputs = tuple(outputs)
        self._reader = reader
        self._pipeline = pipeline
        self._producer = producer
        self._on_fatal = on_fatal

    async def resume(self, positions: Mapping[TopicPartition, int],
                     generations: Mapping[TopicPartition, int] | None = None) -> bool:
        """Settle what was processed, then tell the pipeline actor, per exclusive output
        partition of the newly assigned inputs, what is written there already
        (``generations``: of the root logs forgotten at least once, ``log_marks``).

        False when it failed: the stream is reported failed (aiokafka would
        only log an exception from the assignment callback).
        """
        try:
            outputs, counts = await self._placed()
            plans = [(out, plan) for out in outputs if (plan := out.plan(positions))]
            if plans:
                await self._ask(Flush())
            for out, plan in plans:
                pending = self._producer.pending(frozenset(plan))  # on the loop, as the lanes
                found = await self._reader.written(out, plan, pending, generations)
                for out_tp, (written, late) in found.items():
                    marks = late if late or out.step_id == "late-events" else None
                    await self._ask(ResumeOutputs(out.topic, written, frozenset(plan[out_tp]),
                                                  counts.get(out.topic), marks))
        except Exception as error:
            log.error("cannot resume exclusive republish outputs: %r", error)
            self._on_fatal("ConsumerActor.exclusive_resume", error)
            return False
        return True

    async def _placed(self) -> tuple[list[ExclusiveOutput], dict[str, int]]:
        """The outputs with their partition maps (side outputs: mod their partition
        counts, read now), and those counts; a side topic that does not exist is left out."""
        sides = [out.topic for out in self._outputs if out.side]
        counts = await self._reader.partition_counts(sides) if sides else {}
        for topic in sorted(set(sides) - set(counts)):
            log.warning("topic %r does not exist yet: its records are written at least once "
                        "(a replay may write one again) until the next assignment finds it",
                        topic)
        return [out.spread_over(counts[out.topic]) if out.side else out
                for out in self._outputs if not out.side or out.topic in counts], counts

    async def _ask(self, message: PipelineMessage) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            None, partial(self._pipeline.ask, message))
