"""PipelineActor: runs the whole pipeline over batches and snapshots dirty states.

Every step and aggregate of the pipeline runs here (``PipelineRunner``).
Thread: the actor's own. It is the only owner of the in-memory states, so
folding needs no locks, and its FIFO mailbox orders batches, snapshots and
flushes: a snapshot covers exactly the batches received before it. Each
batch goes to the checkpoint coordinator on the loop in one call
(``Checkpoints.hand_over``: offsets, outputs, the consumer's batch done, and
the snapshot when one is due), in the same order.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow import faults
from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler, ReportingActor
from onceflow.actors.dead_letter_log import DeadLetterWarnings
from onceflow.actors.messages import (
    Assigned,
    Batch,
    Flush,
    Forget,
    LogStats,
    PersistTick,
    PipelineMessage,
    ResumeOutputs,
    Send,
    unexpected,
)
from onceflow.actors.snapshot_rows import snapshot_rows, stored_log_starts
from onceflow.checkpoint.coordinator import Checkpoints, Taking
from onceflow.checkpoint.ledger import LedgerError
from onceflow.checkpoint.log_marks import LogMark
from onceflow.checkpoint.stored_rows import checked_sequence_rows, checked_window_rows
from onceflow.stages.join_runner import JoinRunner
from onceflow.stages.merge_log import MergeLog
from onceflow.stages.outcome import DEAD_LETTER_MAX_VALUE, Output
from onceflow.stages.pipeline import Aggregate, Pipeline, Repartition, Republish
from onceflow.stages.producer_dedup import SEQUENCE_STAGE
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import (
    MAX_STATE_BYTES,
    AggregateState,
    TopicPartition,
    decode_state,
)
from onceflow.stages.watermark import WINDOWS_STAGE
from onceflow.stages.window_clock import IDLE_TIMEOUT, MAX_FUTURE
from onceflow.stores.base import StateStore, UndecodableState
from onceflow.stores.retry import retrying

if TYPE_CHECKING:
    from onceflow.kafka.producer import ProducerActor

log = logging.getLogger(__name__)

# Snapshots that may wait for the store at once before the pipeline actor blocks.
MAX_UNWRITTEN_SNAPSHOTS = 2

#: A processed batch as handed to the coordinator: next offsets, log marks, outputs, and the
#: consumer's batch done.
Batched = tuple[Mapping[TopicPartition, int], Mapping[TopicPartition, LogMark] | None,
                Sequence[Output], Callable[[], None] | None]


def _zero_series(pipeline: Pipeline, republish_topics: Iterable[str]) -> None:
    """Every labelled series of the pipeline exported from the start, at 0: a dashboard or
    alert sees it before its first event, and ``increase()`` counts that event."""
    for spec in pipeline.aggregates:
        for family in (metrics.FOLDED, metrics.DUPLICATES, metrics.LATE, metrics.MISALIGNED):
            family.labels(spec.id)
    for topic in republish_topics:
        metrics.REPUBLISHED.labels(topic)
    for step, _ in pipeline.exclusive_outputs:
        metrics.EXCLUSIVE_SKIPPED.labels(step.topic)


class PipelineActor(ReportingActor):
    def __init__(
        self,
        *,
        pipeline: Pipeline,
        stores: Mapping[str, StateStore],
        dead_letter_topic: str,
        late_events_topic: str,
        producer: ProducerActor,
        checkpoints: Checkpoints,
        on_fatal: FatalHandler,
        single_worker: bool = False,
        max_states: int | None = None,
        dead_letter_max_value: int = DEAD_LETTER_MAX_VALUE,
        idle_timeout: float = IDLE_TIMEOUT,
        max_future: float = MAX_FUTURE,
        max_state_bytes: int = MAX_STATE_BYTES,
        persist_interval: float = 1.0,
        expire_after: float = 0.0,
        merge_log: MergeLog | None = None,  # joins, a single worker's partitions: their order
    ):
        super().__init__(on_fatal)
        self._stores = stores
        kind: Any = PipelineRunner
        joins: dict[str, Any] = {}
        assert merge_log is not None or not pipeline.joins
        if merge_log is not None:  # the inputs ordered by the merge log (stages.join_runner)
            kind, joins = JoinRunner, {"merge_log": merge_log, "across": single_worker,
                                       "log_starts": lambda numbers: stored_log_starts(
                                           self._stores, self._runner, numbers)}
        self._runner: PipelineRunner | JoinRunner = kind(
            pipeline, self._load, dead_letter_topic, late_events_topic,
            claim=None if single_worker else self._claim_homes,
            load_sequences=self._load_sequences, max_states=max_states,
            dead_letter_max_value=dead_letter_max_value, load_rows=self._load_rows,
            idle_timeout=idle_timeout, hold_new=True, max_future=max_future,
            max_state_bytes=max_state_bytes, expire_after=expire_after, **joins)
        self._expiring = [table for table in self._runner.tables if table.expire_after]
        self._sequence_store = pipeline.dedup_store
        self._republish_topics = frozenset(step.topic for step in pipeline.steps
                                           if isinstance(step, Republish | Repartition))
        _zero_series(pipeline, self._republish_topics)
        self._warned_misaligned: set[str] = set()
        self._warned_unkeyed: set[TopicPartition] = set()
        self._dead_letter_warnings = DeadLetterWarnings(log)
        self._producer = producer
        self._checkpoints = checkpoints
        self._stats: Counter[str] = Counter()
        self._totals: Counter[str] = Counter()
        # Snapshots handed over, maybe unwritten: (number, the coordinator's answer).
        self._pending: list[tuple[int, concurrent.futures.Future[Any]]] = []
        self._interval = persist_interval
        self._due = time.monotonic() + persist_interval  # the next snapshot, at the earliest
        self._snapshots = 0  # numbers the snapshots, so the cache knows which are written
        self._cache_totals: Counter[str] = Counter()  # evictions and reloads, for the stats line

    def _load(self, spec: Aggregate, keys: Sequence[str]) -> dict[str, AggregateState]:
        """The stored states of ``keys``; UndecodableState (the worker stops) for a row
        that holds no state onceflow wrote."""
        store = self._stores[spec.store]
        rows = retrying(f"load {spec.id}", lambda: store.load(spec.id, keys))
        metrics.STATE_LOADS.labels(spec.id).inc(len(keys))
        if rows:
            metrics.STATE_RELOADS.labels(spec.id).inc(len(rows))
            self._cache_totals[f"{spec.id}.reloaded"] += len(rows)
        states = {}
        for key, value in rows.items():
            try:
                states[key] = decode_state(value)
            except ValueError as error:
                raise UndecodableState(spec.id, key, store.row_name(spec.id, key),
                                       error) from error
        return states

    def _load_rows(self, store: str, keys: Iterable[str]) -> Mapping[str, bytes]:
        """Watermark and open-window rows (``stages.window_clock``)."""
        keys, where = list(keys), self._stores[store]
        return checked_window_rows(where, retrying("load window rows",
                                                   lambda: where.load(WINDOWS_STAGE, keys)))

    def _load_sequences(self, keys: Sequence[str]) -> Mapping[str, bytes]:
        assert self._sequence_store is not None
        store = self._stores[self._sequence_store]
        return checked_sequence_rows(store, retrying("load producer sequences",
                                                     lambda: store.load(SEQUENCE_STAGE, keys)))

    def _claim_homes(self, spec: Aggregate, feeders: Mapping[str, TopicPartition]
                     ) -> dict[str, TopicPartition]:
        proposals = {key: f"{topic}|{partition}" for key, (topic, partition) in feeders.items()}
        homes = retrying(f"claim homes {spec.id}",
                         lambda: self._stores[spec.store].claim_homes(spec.id, proposals))
        return {key: _partition_of(home) for key, home in homes.items()}

    def on_receive(self, message: PipelineMessage) -> dict[TopicPartition, int] | None:
        match message:
            case Batch():
                self._process(message.records, message.marks, message.done)
            case PersistTick():  # an idle pipeline's; a busy one snapshots after a batch
                if time.monotonic() >= self._due:
                    self._persist(self._snapshot(force=False))
                self._bound_cache()  # an idle worker too drops what its last write freed
                self._expire()
            case LogStats():
                log.info("stats %s", dict(sorted(self._totals.items())))
                log.info("state cache %s", self._cache_stats())
                self._dead_letter_warnings.flush()
            case Flush():
                return self._flush()
            case Forget():
                try:
                    self._forget(message.partitions)
                except LedgerError as error:  # an ask's error reaches only the asker
                    self._on_fatal(type(self).__name__, error)
                    raise
            case Assigned():
                self._runner.assigned(message.partitions, message.generations)
                if isinstance(self._runner, JoinRunner) and message.positions is not None:
                    self._runner.start(message.positions)
            case ResumeOutputs():
                self._runner.written.resume(message.topic, message.written, message.scanned)
                if message.partitions is not None:
                    self._runner.side.partitions[message.topic] = message.partitions
                if message.late is not None:
                    self._runner.side.late.resume(message.late, message.scanned)
            case _:
                unexpected("PipelineActor", message)
        return None

    def _flush(self) -> dict[TopicPartition, int]:
        """Checkpoint everything processed and wait until every checkpoint is written.

        Always a checkpoint, even with nothing new: the answer then also
        waits for snapshots told earlier and still being written (FIFO mailbox).
        """
        taking = self._snapshot(force=True)
        self._persist(taking)
        while self._pending:
            number, written = self._pending.pop(0)
            written.result()
            self._runner_written(number)
        offsets = taking.answer.result()
        assert offsets is not None  # forced: always a checkpoint
        return dict(offsets)

    def _forget(self, partitions: frozenset[TopicPartition]) -> None:
        """Drop the cached states (every key reloads) and the partitions' progress.

        Refuses (the actor fails, the supervisor restarts it from what is
        durable) when records of theirs are processed but not written: those
        states may be stale now, and writing them could overwrite the newer
        ones of the member that took the partitions over.
        """
        unwritten = self._checkpoints.run(lambda ledger: ledger.unwritten(partitions))
        if unwritten:
            raise LedgerError(f"partitions {unwritten} moved with processed records not "
                              "written: restarting from what is durable")
        self._flush()  # the other partitions' dirty states, before the cache goes
        self._runner.forget()
        self._checkpoints.run(lambda ledger: ledger.forget(partitions))

    def _persist(self, taking: Taking, after: Batched | None = None) -> None:
        """Hand a snapshot to the coordinator (with ``after``, the batch it follows, in the
        same hand-off); block while too many are unwritten.

        Blocking here is the backpressure of a slow or unreachable store: the
        actor stops taking batches, the consumer reaches its in-flight bound
        and pauses its partitions, instead of snapshots piling up in memory.
        A failed write surfaces here and fails this actor (the supervisor
        restarts the pipeline from what is durable).
        """
        self._reap()
        number = self._snapshots  # the snapshot just taken (``_snapshot`` numbered it)
        if after is None:
            self._checkpoints.take(taking)
        else:
            self._checkpoints.hand_over(*after, taking)
        self._pending.append((number, taking.answer))
        while len(self._pending) > MAX_UNWRITTEN_SNAPSHOTS:
            number, written = self._pending.pop(0)
            written.result()
            self._runner_written(number)

    def _reap(self) -> None:
        """Forget the snapshots persistence has written; their states may now be evicted."""
        while self._pending and _written(self._pending[0][1]):
            self._runner_written(self._pending.pop(0)[0])

    def _runner_written(self, number: int) -> None:
        for table in self._runner.tables:
            table.written(number)

    def _expire(self) -> None:
        """Drop the cached states whose store rows have expired (``StateTable.expire``):
        before each batch, so a key's next record loads what the store holds, and on each
        persistence tick. Per batch, not per record: one clock read per expiring stage."""
        if not self._expiring:
            return
        self._reap()  # snapshots written since: their states are no longer pinned
        for table in self._expiring:
            expired = table.expire()
            if expired:
                self._cache_totals[f"{table.spec.id}.expired"] += expired

    def _bound_cache(self) -> None:
        """Evict written states beyond the limit (after each batch and persistence tick) and
        update the gauges."""
        self._reap()
        for table in self._runner.tables:
            stage = table.spec.id
            evicted = table.evict()
            if evicted:
                metrics.STATE_EVICTIONS.labels(stage).inc(evicted)
                self._cache_totals[f"{stage}.evicted"] += evicted
            metrics.CACHED_STATES.labels(stage).set(len(table.states))
            metrics.CACHED_STATE_BYTES.labels(stage).set(table.encoded_bytes)

    def _cache_stats(self) -> dict[str, int]:
        """Per stage: states cached, their encoded bytes, evictions and reloads so far."""
        stats = dict(self._cache_totals)
        for table in self._runner.tables:
            stats[f"{table.spec.id}.cached"] = len(table.states)
            stats[f"{table.spec.id}.encoded_bytes"] = table.encoded_bytes
        return dict(sorted(stats.items()))

    def _process(self, records: Sequence[Any],
                 marks: Mapping[TopicPartition, LogMark] | None = None,
                 done: Callable[[], None] | None = None) -> None:
        poison = faults.STAGE_RAISES_ON
        if poison and any(poison in (record.value or b"") for record in records):
            raise faults.InjectedFailure("injected stage failure")
        self._expire()
        outcome = self._runner.process(records)
        if outcome.outputs:  # exclusive outputs: their epochs first (fenced: it raises)
            self._producer.check(Send(outcome.outputs, 0, frozenset(outcome.next_offsets)))
        batch = outcome.stats(len(records))
        self._stats.update(batch)
        metrics.RECORDS.inc(len(records))
        metrics.DEAD_LETTERS.inc(outcome.dead_letters)
        if outcome.rejected:
            self._dead_letter_warnings.record(outcome.rejected, outcome.first_rejection)
        for family, counts in ((metrics.FOLDED, outcome.folded),
                               (metrics.DUPLICATES, outcome.duplicates),
                               (metrics.LATE, outcome.late),
                               (metrics.PRODUCER_DUPLICATES, outcome.producer_duplicates)):
            for stage_id, n in counts.items():
                family.labels(stage_id).inc(n)
        if outcome.outputs:
            for topic, n in Counter(output.topic for output in outcome.outputs
                                    if output.topic in self._republish_topics).items():
                metrics.REPUBLISHED.labels(topic).inc(n)
        for topic, n in outcome.exclusive_skipped.items():
            metrics.EXCLUSIVE_SKIPPED.labels(topic).inc(n)
        if outcome.side_skipped:
            metrics.SIDE_SKIPPED.inc(outcome.side_skipped)
        metrics.progressed()
        self._totals.update(batch)
        for stage_id, n in outcome.misaligned.items():
            metrics.MISALIGNED.labels(stage_id).inc(n)
            if stage_id not in self._warned_misaligned:  # once per stage, then the counters
                self._warned_misaligned.add(stage_id)
                log.warning("dead-lettered a record fed from the wrong partition (%d in this "
                            "batch; see onceflow_misaligned_records): %s", n,
                            outcome.misaligned_reason[stage_id])
        sequences = self._runner.sequences
        if sequences is not None:
            self._warn_unkeyed(sequences.unkeyed())
        # One hand-off to the loop: processed offsets, outputs to their lanes, the batch
        # done to the consumer, and a snapshot right after this batch when one is due.
        handed: Batched = (outcome.next_offsets, marks, outcome.outputs, done)
        if time.monotonic() >= self._due:
            self._persist(self._snapshot(force=False), after=handed)
        else:
            self._checkpoints.hand_over(*handed, None)
        self._bound_cache()

    def _warn_unkeyed(self, partitions: list[TopicPartition]) -> None:
        """Once per partition: producer dedup compares a re-send with the records of its
        own partition, and a re-send without a key may land on another."""
        for topic, partition in partitions:
            if (topic, partition) not in self._warned_unkeyed:
                self._warned_unkeyed.add((topic, partition))
                log.warning("%s[%d] has records without a Kafka key: producer dedup finds a "
                            "re-send only on its original's partition, and a producer that "
                            "re-sends without a key may land on another (then it is counted "
                            "twice); key the records, by producer or by producer and sequence "
                            "(docs/guide/reading-topics-and-producer-duplicates.md)",
                            topic, partition)

    def _snapshot(self, force: bool) -> Taking:
        """Encode dirty states now: later folds cannot change what gets written. The
        coordinator numbers it (``Ledger.take``) after every batch handed over before."""
        self._snapshots += 1
        self._due = time.monotonic() + self._interval
        if isinstance(self._runner, JoinRunner):  # row versions no replay can need go
            self._runner.committed(self._checkpoints.last_committed)
        rows = snapshot_rows(self._runner, self._sequence_store, self._snapshots)
        stats = dict(self._stats)
        self._stats.clear()
        return Taking(rows, stats, force)


def _partition_of(home: str) -> TopicPartition:
    topic, _, partition = home.rpartition("|")
    return topic, int(partition)


def _written(snapshot: concurrent.futures.Future[Any]) -> bool:
    """True once the coordinator answered; a failed write re-raises here."""
    if not snapshot.done():
        return False
    snapshot.result()
    return True
