"""Applies batches of consumed records to a pipeline's in-memory states.

Pure logic, no I/O: the runtime hands in records, a loader for states not yet in memory, and gets
back what to produce, what to dead-letter and which offsets the batch covered. Each record is one
unit: every value it fans out to is folded into every aggregate, or none is (its new states are
staged and only then installed).

A pipeline with repartition steps runs as segments: the source topics feed the first, each
repartition topic the next; the runner picks a record's segment by the topic it was consumed from.

Key homes: when several workers may share the pipeline's consumer group, each aggregate state may
be fed from one input partition only (its *home*, claimed atomically in the store when the key is
first seen). Two workers folding one key from two partitions would each write their own copy of the
state and the last write would win, losing the other's folds; a record whose key is homed on
another partition is dead-lettered instead, with a reason that says to repartition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from onceflow.stages.formats import FormatError
from onceflow.stages.general_path import GeneralPath
from onceflow.stages.guards import unknown_keys
from onceflow.stages.heads import Heads
from onceflow.stages.outcome import (
    DEAD_LETTER_MAX_VALUE,
    BatchOutcome,
    ConsumedRecord,
    KeyHomedElsewhere,
    StageFailure,
    dead_letter,
)
from onceflow.stages.pipeline import Aggregate, Pipeline, Republish
from onceflow.stages.plan import Emit, Fold, Plan
from onceflow.stages.producer_dedup import PartitionSequences, SequenceLoader, SequenceTables
from onceflow.stages.republish import WrittenOutputs, defaults, republished
from onceflow.stages.segments import AGGREGATE, REPUBLISH, segments, through
from onceflow.stages.side_outputs import SideOutputs
from onceflow.stages.single_fold import FoldSegment
from onceflow.stages.state import MAX_STATE_BYTES, AggregateState, TopicPartition
from onceflow.stages.state_table import StateTable
from onceflow.stages.watermark import RowLoader
from onceflow.stages.window_clock import IDLE_TIMEOUT, MAX_FUTURE, StateLoader, WindowClock
from onceflow.stages.window_fold import WindowSegment
from onceflow.stages.windows import empty_windows

#: Claims each key's home partition if it has none yet; answers every key's home.
HomeClaimer = Callable[[Aggregate, Mapping[str, TopicPartition]], Mapping[str, TopicPartition]]


class PlanPath(Protocol):
    """Applies a record's plan: ``GeneralPath``, or the tests' reference model
    (``tests/unit/fold_model.py``) that the engine's paths are compared with."""

    def apply(self, plan: Plan, outcome: BatchOutcome) -> None: ...


class PipelineRunner:
    """Runs a pipeline's steps over batches; owns the in-memory state tables.

    The per-record path is written for speed (it is the whole cost of a
    worker beside Kafka I/O): user functions are called directly inside one
    try block per record, and the failing stage is known from ``stage``.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        load: StateLoader,
        dead_letter_topic: str,
        late_topic: str = "onceflow-late-events",
        claim: HomeClaimer | None = None,
        load_sequences: SequenceLoader | None = None,
        max_states: int | None = None,  # per aggregate; see StateTable
        dead_letter_max_value: int = DEAD_LETTER_MAX_VALUE,  # value bytes a dead letter keeps
        load_rows: RowLoader | None = None,  # watermark and open-window rows (window_clock)
        idle_timeout: float = IDLE_TIMEOUT,
        hold_new: bool = False,  # a first start waits idle_timeout for unmet roots (watermark)
        max_future: float = MAX_FUTURE,  # seconds an event time may lead its record's timestamp
        max_state_bytes: int = MAX_STATE_BYTES,  # per aggregate value encoded (guards)
        expire_after: float = 0.0,  # s; an aggregate's own expire_after wins (StateTable)
    ):
        self.pipeline = pipeline
        self.tables = [StateTable(spec, max_states, max_state_bytes, expire_after)
                       for spec in pipeline.aggregates]
        self._segments = segments(pipeline, self.tables)
        self._first = self._segments[pipeline.topics[0]]
        self._load = load
        self._claim = claim
        self._dead_letter_topic = dead_letter_topic
        self._max_value = dead_letter_max_value
        self.sequences = None if pipeline.dedup is None else SequenceTables(  # producer dedup
            pipeline.dedup, pipeline.topics, load_sequences, pipeline.dedup_store)
        self._head = Heads(pipeline, self.sequences, [  # their steps never read an envelope
            topic for topic, steps in self._segments.items()
            if all(kind is not REPUBLISH for kind, *_ in steps)])
        self.written = WrittenOutputs()  # what exclusive republish steps find written
        #: Root input partitions whose log was forgotten (``lineage.root_offset``): generation.
        self.generations: dict[TopicPartition, int] = {}
        self.side = SideOutputs(self.written, self.generations)  # dead letters, late events
        self.clocks = {t: WindowClock(t, idle_timeout, load_rows, hold_new, max_future)
                       for t in self.tables if t.spec.window is not None}
        self._fused: dict[str, FoldSegment | WindowSegment] = {}  # the common shapes, fused
        for topic, steps in self._segments.items():
            fused = FoldSegment.of(steps, claim is not None) or WindowSegment.of(
                steps, claim is not None, self.clocks, self.side, late_topic, pipeline.id,
                dead_letter_max_value)
            if fused is not None:
                self._fused[topic] = fused
        self._counting = list(self._fused.values())  # each counts its own, per batch
        self._general: PlanPath = GeneralPath(self.clocks, self.side, claim is not None, late_topic,
                                    dead_letter_max_value, pipeline.id)

    def process(self, records: Iterable[ConsumedRecord]) -> BatchOutcome:
        """Apply records in order; states not in memory are loaded in one batch.

        Records are applied as they are planned while every key they touch
        is cached (the steady state). From the first record that needs a load,
        records are held back, the missing states loaded in one batched read, and
        the held-back records applied in their order (dead letters too: each input
        partition's are written in its order), fused where their topic is.
        """
        outcome = BatchOutcome()
        for fused_segment in self._counting:  # a batch that raised left its counts behind
            fused_segment.reset()
        held: list[Plan | tuple[ConsumedRecord, Exception]] = []
        missing: dict[StateTable, dict[str, TopicPartition]] = {}  # key -> first feeder
        next_offsets = outcome.next_offsets
        sequences = self.sequences
        if sequences is not None:
            records = list(records)  # read again if a producer-sequence table must load
        # Runs of one partition (getmany's): a key and a producer-sequence table per run,
        # its next offset noted at its end.
        fed_from: TopicPartition = ("", -1)
        fused: FoldSegment | WindowSegment | None = None  # the run's topic's fused segment
        last = -1
        sequence_table: PartitionSequences | None = None
        start = replays = 0  # the table's next offset when the run began; records skipped
        for record in records:
            topic, partition, offset = record.topic, record.partition, record.offset  # once
            if partition != fed_from[1] or topic != fed_from[0]:
                if last >= 0:
                    next_offsets[fed_from] = last + 1
                    if sequence_table is not None:
                        assert sequences is not None
                        sequences.covered(fed_from, sequence_table, start, replays)
                fed_from = (topic, partition)
                fused = self._fused.get(topic)
                if sequences is not None:
                    sequence_table = sequences.table_of(fed_from, records)
                    start = 0 if sequence_table is None else sequence_table.next_offset
                    replays = 0
            last = offset
            if sequence_table is not None:  # a source record below it was classified: skipped
                if offset < sequence_table.next_offset:  # whole
                    replays += 1
                    continue
                sequence_table.next_offset = offset + 1
            try:
                if fused is None or held or missing:
                    plan = self._plan(record, fed_from, sequence_table)
                else:  # the common shape, folded without a plan while its keys are cached
                    head = self._head(record, fed_from, offset, sequence_table)
                    plan = None if head is None else fused.run(record, fed_from, head, outcome)
                    if plan is None:
                        continue
            except (StageFailure, FormatError) as failure:
                self._reject(outcome, record, failure, held)
                continue
            if plan is None:
                continue  # a producer duplicate
            try:
                new_keys = unknown_keys((share.table, share.keys) for share in plan.order
                                        if type(share) is Fold)
            except StageFailure as failure:
                self._reject(outcome, record, failure, held)
                continue
            for table, key in new_keys:
                missing.setdefault(table, {}).setdefault(key, fed_from)
            if held or missing:
                held.append(plan)
                continue
            try:
                self._general.apply(plan, outcome)
            except StageFailure as failure:
                self._dead_letter(outcome, plan.record, failure)
        if last >= 0:
            next_offsets[fed_from] = last + 1
            if sequence_table is not None:
                assert sequences is not None
                sequences.covered(fed_from, sequence_table, start, replays)
        failed: dict[tuple[StateTable, str], StageFailure] = {}  # keys whose init raised
        for table, feeders in missing.items():
            self._load_into(table, dict(sorted(feeders.items())), failed)
        for entry in held:  # in order; on the fused path where their topic has one
            if isinstance(entry, tuple):
                self._dead_letter(outcome, entry[0], entry[1])
                continue
            if failed:
                uninitialised = _uninitialised(entry, failed)
                if uninitialised is not None:
                    self._dead_letter(outcome, entry.record, uninitialised)
                    continue
            try:
                record = entry.record
                fused = self._fused.get(record.topic)
                if fused is None or not fused.apply(entry, (record.topic, record.partition),
                                                    outcome):
                    self._general.apply(entry, outcome)
            except StageFailure as failure:
                self._dead_letter(outcome, entry.record, failure)
        for fused_segment in self._counting:
            fused_segment.count(outcome)
        if sequences is not None:
            sequences.count(outcome)
        outcome.side_skipped, self.side.skipped = self.side.skipped, 0
        if self.written.skipped:
            outcome.exclusive_skipped, self.written.skipped = self.written.skipped, {}
        self.advance()
        return outcome

    def assigned(self, partitions: Iterable[TopicPartition],
                 generations: Mapping[TopicPartition, int] | None = None) -> None:
        """Windowed stages read back the rows of the partitions feeding them (window_clock);
        republish steps learn the generation of each root log (``log_marks``)."""
        for tp in partitions:
            self.generations.pop(tp, None)
        self.generations.update((generations or {}).items())
        for table, clock in self.clocks.items():
            for tp in partitions:
                if any(t is table for *_, t, _ in self._segments.get(tp[0], ())):
                    clock.meet(tp)

    def advance(self) -> None:
        """Close the windows of every key the watermarks passed (``window_clock``)."""
        for clock in self.clocks.values():  # a store failure fails the actor, as a load does
            clock.sweep(self._load)

    def _reject(self, outcome: BatchOutcome, record: ConsumedRecord, failure: Exception,
                held: list[Plan | tuple[ConsumedRecord, Exception]]) -> None:
        """Dead-letter now, or after the records held back before it."""
        if held:
            held.append((record, failure))
        else:
            self._dead_letter(outcome, record, failure)

    def forget(self) -> None:
        """Drop every cached state (after a rebalance another worker may own them)."""
        for table in self.tables:
            table.clear()
        for clock in self.clocks.values():
            clock.forget()
        if self.sequences is not None:
            self.sequences.forget()

    def _plan(self, record: ConsumedRecord, fed_from: TopicPartition,
              sequence_table: PartitionSequences | None) -> Plan | None:
        """The record through the stateless steps; None for a producer duplicate.
        ``sequence_table``: its partition's producer sequences, if it has them."""
        head = self._head(record, fed_from, record.offset, sequence_table)
        if head is None:
            return None
        envelope, root, route, values, positions = head
        plan = Plan(record, root, route, [])
        stage = ""
        try:
            for kind, stage, fn, table, step in self._segments.get(  # noqa: B007 (the except)
                    record.topic, self._first):
                if kind is AGGREGATE:
                    assert fn is not None and table is not None
                    share = Fold(table, list(map(fn, values)), positions, values)
                    plan.order.append(share)
                elif kind is REPUBLISH:
                    assert isinstance(step, Republish)
                    pairs = list(zip(positions, values, strict=True))
                    time_ms, key = defaults(envelope, record)
                    generation = self.generations.get(
                        (record.topic, record.partition), 0) if self.generations else 0
                    plan.order.append(Emit(*republished(step, envelope, record, root, pairs,
                                                         time_ms, key, self.written,
                                                         generation)))
                else:
                    assert fn is not None
                    values, positions = through(kind, fn, values, positions)
        except Exception as error:
            raise StageFailure(stage, error) from error
        return plan

    def _load_into(self, table: StateTable, feeders: dict[str, TopicPartition],
                   failed: dict[tuple[StateTable, str], StageFailure]) -> None:
        """Load states (new keys start from ``init``); claim a home for those without one.

        A key whose ``init`` raises is not cached but noted in ``failed``: the records
        held back for it are dead-lettered, and its next record tries again.
        """
        loaded = self._load(table.spec, list(feeders))
        for key in feeders:
            state = loaded.get(key)
            if state is None:
                try:
                    initial = empty_windows() if table.spec.window else table.spec.init()
                except Exception as error:
                    failed[(table, key)] = StageFailure(table.spec.id, error, key)
                    continue
                state = AggregateState(initial)
            table.install(key, state)
        if self._claim is None:
            return
        homeless = {key: fed for key, fed in feeders.items()
                    if (table, key) not in failed and table.states[key].home is None}
        if homeless:
            homes = self._claim(table.spec, homeless)
            for key in homeless:
                table.states[key].home = homes[key]

    def _dead_letter(
        self, outcome: BatchOutcome, record: ConsumedRecord, reason: Exception
    ) -> None:
        """A replay skips a dead letter already written (``side_outputs``); a key homed
        elsewhere is counted too."""
        if isinstance(reason, StageFailure) and isinstance(reason.error, KeyHomedElsewhere):
            outcome.misaligned[reason.stage_id] += 1
            outcome.misaligned_reason.setdefault(reason.stage_id, str(reason))
        letter = dead_letter(self._dead_letter_topic, record, self.pipeline.id, reason,
                             self._max_value)
        for placed in self.side.placed((letter,), record):
            outcome.dead_letter(placed, reason)


def _uninitialised(plan: Plan, failed: dict[tuple[StateTable, str], StageFailure]
                   ) -> StageFailure | None:
    """The failure of the first key of ``plan`` whose ``init`` raised, if any."""
    for share in plan.order:
        if type(share) is Fold:
            for key in share.keys:
                failure = failed.get((share.table, key))
                if failure is not None:
                    return failure
    return None
