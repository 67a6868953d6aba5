"""Run a pipeline in memory, with the worker's own runner: states, outputs, dead letters, replays.

``TestRun`` feeds records through ``onceflow.stages.runner.PipelineRunner``
(the code a worker runs) with a dict for a store: states go through the same
encoding as in Redis or Cassandra, closed windows become history rows, and
key homes are claimed set-if-absent when ``single_worker=False``. Crashes,
replays from the last commit and re-delivered records are applied by that
same runner, so a test shows whether a pipeline is exact under them without
Kafka. Repartition outputs are fed back to the run, so a whole pipeline runs
end to end.

Example:
    >>> import json
    >>> from onceflow import Pipeline
    >>> from onceflow.testing import Record, TestRun
    >>> words = (Pipeline("words", topics=("lines",), decode=lambda e: json.loads(e.payload))
    ...          .flat_map("split", str.split)
    ...          .aggregate("count", key=str, init=lambda: 0, fold=lambda n, _: n + 1))
    >>> run = TestRun(words)
    >>> first, second = run.feed([Record("a b a"), Record("b")])
    >>> run.states("count")
    {'a': 2, 'b': 2}
    >>> run.duplicate(first)                 # Kafka delivers offset 0 again
    >>> run.states("count"), run.counters["count.duplicates"]
    ({'a': 2, 'b': 2}, 3)
    >>> run.commit()                         # states written, offsets committed
    >>> _ = run.feed([Record("c a")])
    >>> run.persist()                        # written, not committed...
    >>> run.crash()                          # ...so offset 2 is replayed, and discarded
    >>> run.states("count"), run.counters["count.duplicates"]
    ({'a': 3, 'b': 2, 'c': 1}, 5)
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from aiokafka.partitioner import murmur2

from onceflow.stages.declarations import MERGE_LOG_STAGE
from onceflow.stages.join_runner import JoinRunner
from onceflow.stages.merge_log import (
    MemoryMergeLog,
    encode_start,
    needs_merge_log,
)
from onceflow.stages.outcome import BatchOutcome
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, PartitionSequences
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import (
    AggregateState,
    TopicPartition,
    compact_json,
    decode_state,
    encode_state,
)
from onceflow.stages.state_table import StateTable
from onceflow.stages.watermark import WINDOWS_STAGE
from onceflow.stages.window_clock import IDLE_TIMEOUT, MAX_FUTURE
from onceflow.testing_records import (
    Consumed,
    DeadLetter,
    Hop,
    LateEvent,
    Produced,
    Record,
    envelope,
)
from onceflow.testing_store import MemoryStore

DEAD_LETTER_TOPIC = "onceflow-dead-letters"  # the defaults of reference.conf
LATE_EVENTS_TOPIC = "onceflow-late-events"

__all__ = ["Consumed", "DeadLetter", "Hop", "LateEvent", "Produced", "Record", "TestRun",
           "envelope", "partition_for"]


def partition_for(key: bytes | None, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key); no key goes to partition 0."""
    return 0 if key is None else (int(murmur2(key)) & 0x7FFFFFFF) % partitions


class TestRun:
    """One simulated worker (restarted by ``crash``) over an in-memory log and store.

    Records are processed in the order they are fed, in batches of
    ``batch_size`` (default: all fed at once). ``persist()`` writes the
    changed states (and closed windows) to the store; ``commit()`` persists,
    then commits the consumed offsets, as the worker does on SIGTERM;
    ``persist_every``/``commit_every`` do that after every N records consumed
    (replayed and repartition records count: the worker's intervals run on).
    ``crash()`` loses what was not persisted and replays the log from the
    committed offsets. A repartition topic gets the step's ``partitions``, or
    ``partitions`` (standing for the source topics' count) like the worker's.
    """

    __test__: ClassVar[bool] = False  # not a pytest test class

    def __init__(self, pipeline: Pipeline, *, single_worker: bool = True, partitions: int = 1,
                 batch_size: int | None = None, persist_every: int | None = None,
                 commit_every: int | None = None, dead_letter_topic: str = DEAD_LETTER_TOPIC,
                 late_events_topic: str = LATE_EVENTS_TOPIC, idle_timeout: float = IDLE_TIMEOUT,
                 max_future: float = MAX_FUTURE, first_start_waits: bool = False):
        self.pipeline = pipeline
        self.idle_timeout = idle_timeout  # window watermarks, seconds of event time
        self.first_start_waits = first_start_waits  # as the worker: hold_new (watermark)
        self.max_future = max_future  # seconds an event time may lead its record's timestamp
        self.single_worker = single_worker
        self.dead_letter_topic, self.late_events_topic = dead_letter_topic, late_events_topic
        self._hops = {step.topic: step.partitions or partitions for step in pipeline.repartitions}
        self._batch_size = batch_size
        self._every = (persist_every, commit_every)
        self.store = MemoryStore()  # what a crash keeps
        self._log: list[Consumed] = []  # every record consumed once, in order
        self._at: dict[tuple[str, int, int], Consumed] = {}
        self._ends: dict[TopicPartition, int] = {}  # next offset per partition
        self._processed: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._pending: deque[Consumed] = deque()
        self._consumed = 0
        self.produced: list[Produced] = []
        self.dead_letters: list[DeadLetter] = []
        self.late: list[LateEvent] = []
        #: The worker's stats: ``records``, ``dead_letters``, ``<stage>.folded``,
        #: ``<stage>.duplicates``, ``<stage>.late``, ``<stage>.misaligned``, and with
        #: ``dedup=`` ``source.producer_duplicates`` and ``source.duplicates`` (replays).
        self.counters: Counter[str] = Counter()
        self.crashes = 0
        self._snapshots = 0
        #: joins, a single worker's aggregates: the order their inputs were applied in
        self.merge_log = MemoryMergeLog()
        self.runner = self._new_runner()  # the worker's runner; crash() replaces it

    def feed(self, records: Iterable[Record]) -> list[Consumed]:
        """Append records to their partitions and process them; returns them with offsets."""
        consumed = []
        for record in records:
            topic = record.topic or self.pipeline.topics[0]
            tp = (topic, record.partition)
            end = self._ends.get(tp, 0)
            offset = end if record.offset is None else record.offset
            if offset < end:
                raise ValueError(f"{topic}/{record.partition}: offset {offset} is taken (next is "
                                 f"{end}); use duplicate() to deliver a record again")
            value = record.to_bytes(self.pipeline.format_of(topic))
            consumed.append(self._append(Consumed(topic, record.partition, offset, value,
                                                  record.key_bytes,
                                                  tuple(record.headers), record.timestamp)))
        self._pending.extend(consumed)
        self._drain()
        return consumed

    def duplicate(self, *records: Consumed) -> None:
        """Deliver records again at their offsets, as Kafka does after a failure."""
        for record in records:
            self._at.setdefault((record.topic, record.partition, record.offset), record)
        self._pending.extend(records)
        self._drain()

    def replay(self, from_offsets: Mapping[TopicPartition, int] | None = None,
               order: Callable[[list[Consumed]], Iterable[Consumed]] | None = None) -> None:
        """Deliver the log again from ``from_offsets`` (default: the committed ones).

        A partition not named is replayed from its start; the run keeps its
        in-memory states (a consumer seeking back, not a crash). ``order`` interleaves
        the partitions otherwise than they were fed (each partition's own order kept, as
        a Kafka consumer keeps it).
        """
        start = self._committed if from_offsets is None else from_offsets
        again = [r for r in self._log if r.offset >= start.get((r.topic, r.partition), 0)]
        if order is not None:
            again = _reordered(again, order)
        self._pending.extend(again)
        self._drain()

    def crash(self, *, mid_persist: bool = False,
              order: Callable[[list[Consumed]], Iterable[Consumed]] | None = None) -> None:
        """Kill and restart the worker: unpersisted states are lost, the log replays from
        the committed offsets (states persisted since are reloaded and discard the replay).

        ``mid_persist``: the kill lands inside a persist, after the states are written
        and before the producer sequences (``dedup=``), which a worker writes last.
        ``order``: the replay's interleaving of the partitions (see ``replay``).
        """
        if mid_persist:
            self._persist_states()
        self.crashes += 1
        self.merge_log.epoch = self.crashes  # the new owner's: higher than every one before
        self._processed = {}
        self.runner = self._new_runner()
        self.runner.assigned(self._ends)  # the worker's assignment: every partition
        self.replay(order=order)

    def persist(self) -> None:
        """Write changed states and closed windows, then the producer sequences (``dedup=``),
        as a persistence interval does."""
        self._persist_states()
        self._write_log_starts()
        if self.runner.sequences is not None:
            for key, row in self.runner.sequences.take_dirty().items():
                self.store.rows[(SEQUENCE_STAGE, key)] = row

    def _write_log_starts(self) -> None:
        """Where each co-partition's merge log is read from next, as of the committed
        offsets: written with each snapshot, as the worker writes it."""
        if isinstance(self.runner, JoinRunner):
            self.runner.committed(self._committed)
            for number, start in self.runner.take_log_starts().items():
                self.store.rows[(MERGE_LOG_STAGE, str(number))] = encode_start(start)

    def _persist_states(self) -> None:
        clocks = list(self.runner.clocks.values())
        for clock in clocks:  # the open-window index before the states
            rows = clock.rows_before_states()
            self.store.rows.update(((WINDOWS_STAGE, key), row) for key, row in rows.items())
        for table in self.runner.tables:
            stage = table.spec.id
            for (key, start), value in table.take_closed().items():
                self.store.history[(stage, key, start)] = compact_json(value)
            for key, data in table.take_dirty(self._snapshots).items():
                self.store.rows[(stage, key)] = data
            table.written(self._snapshots)  # in memory, written at once
        for clock in clocks:  # the watermarks after them
            rows = clock.rows_after_states()
            self.store.rows.update(((WINDOWS_STAGE, key), row) for key, row in rows.items())
        self._snapshots += 1

    def commit(self) -> None:
        """Persist, then commit every offset processed so far."""
        self.persist()
        self._committed.update(self._processed)  # the runner hears of it at the next persist

    @property
    def producer_duplicates(self) -> int:
        """Producer duplicates dropped, as the persisted sequence rows count them (``dedup=``):
        exact across crashes, unlike ``counters``, which also count replayed work."""
        return sum(PartitionSequences.decode(row).duplicates
                   for row in self.store.stage_rows(SEQUENCE_STAGE).values())

    @property
    def committed(self) -> dict[TopicPartition, int]:
        """The next offset to consume per partition after a crash."""
        return dict(self._committed)

    def log(self, topic: str | None = None) -> list[Consumed]:
        """Records consumed once (fed, or produced to a repartition topic), in order."""
        return [r for r in self._log if topic is None or r.topic == topic]

    def outputs(self, topic: str | None = None) -> list[Produced]:
        """Records produced to ``topic``, or to any topic but dead letters and late events."""
        side = (self.dead_letter_topic, self.late_events_topic)
        return [p for p in self.produced
                if p.topic == topic or (topic is None and p.topic not in side)]

    def states(self, stage_id: str, *, persisted: bool = False) -> dict[str, Any]:
        """Each key's state value as the store holds it after the next ``persist()``
        (``persisted=True``: as it holds it now), through the store's encoding."""
        return {key: state.value for key, state in self._view(stage_id, persisted).items()}

    def watermarks(self, stage_id: str, key: str) -> dict[tuple[str, int], tuple[int, ...]]:
        """Per route (the root partition, or ``"<root>/<p>>...><topic>"`` and the last hop's
        partition for an event re-keyed more than once), the highest position folded into
        a key's state (``onceflow.stages.lineage``)."""
        return self._view(stage_id, False)[key].watermarks

    def closed_windows(self, stage_id: str, *, persisted: bool = False
                       ) -> dict[tuple[str, int], Any]:
        """(key, window start) -> final value of every closed window: the history rows."""
        rows = {(key, start): json.loads(value)
                for key, start, value in self.store.stage_history(stage_id)}
        if not persisted:
            closed = self._table(stage_id).closed.items()
            rows.update({slot: json.loads(json.dumps(value)) for slot, value in closed})
        return dict(sorted(rows.items()))

    def windows(self, stage_id: str) -> dict[tuple[str, int], Any]:
        """Closed windows and the open ones, as the analytics readers return them."""
        rows = self.closed_windows(stage_id)
        for key, value in self.states(stage_id).items():
            rows.update({(key, int(start)): v for start, v in value["open"].items()})
        return dict(sorted(rows.items()))

    def _view(self, stage_id: str, persisted: bool) -> dict[str, AggregateState]:
        table = self._table(stage_id)
        rows = self.store.stage_rows(stage_id)
        if not persisted:
            rows.update({key: encode_state(table.states[key]) for key in table.dirty})
        return {key: decode_state(value) for key, value in sorted(rows.items())}

    def _table(self, stage_id: str) -> StateTable:
        for table in self.runner.tables:
            if table.spec.id == stage_id:
                return table
        names = [table.spec.id for table in self.runner.tables]
        raise KeyError(f"no aggregate {stage_id!r} in pipeline {self.pipeline.id!r}: {names}")

    def _new_runner(self) -> PipelineRunner | JoinRunner:
        kind: Any = PipelineRunner
        joins: dict[str, Any] = {}
        # joins, or a single worker's aggregates: started at the committed offsets, with
        # the merge log (in memory, any partition count: several may be fed)
        if needs_merge_log(self.pipeline, self.single_worker, None):
            kind, joins = JoinRunner, {"merge_log": self.merge_log, "positions": self._committed,
                                       "across": self.single_worker,
                                       "log_starts": self.store.log_starts}
        runner: PipelineRunner | JoinRunner = kind(
            self.pipeline, self.store.load, self.dead_letter_topic, self.late_events_topic,
            claim=None if self.single_worker else self.store.claim,
            load_sequences=self.store.load_sequences, load_rows=self.store.load_rows,
            idle_timeout=self.idle_timeout, max_future=self.max_future,
            hold_new=self.first_start_waits, **joins)
        return runner

    def _append(self, record: Consumed) -> Consumed:
        self._log.append(record)
        self._at[(record.topic, record.partition, record.offset)] = record
        self._ends[(record.topic, record.partition)] = record.offset + 1
        return record

    def _drain(self) -> None:
        """Process pending records in batches; repartition outputs join the queue."""
        while self._pending:
            n = len(self._pending)
            if self._batch_size:
                n = min(n, self._batch_size)
            for every in self._every:
                if every:
                    n = min(n, every - self._consumed % every)
            self._absorb(self.runner.process([self._pending.popleft() for _ in range(n)]), n)
            self._consumed += n
            persist_every, commit_every = self._every
            if commit_every and self._consumed % commit_every == 0:
                self.commit()
            elif persist_every and self._consumed % persist_every == 0:
                self.persist()

    def _absorb(self, outcome: BatchOutcome, records: int) -> None:
        for tp, offset in outcome.next_offsets.items():  # a re-delivery does not rewind
            self._processed[tp] = max(offset, self._processed.get(tp, 0))
        self.counters += outcome.stats(records)  # drops zeros: counters hold only what happened
        for out in outcome.outputs:
            headers = {name: value.decode() for name, value in out.headers}
            produced = Produced(out.topic, out.key, out.value, headers)
            self.produced.append(produced)
            if out.topic == self.dead_letter_topic:
                self.dead_letters.append(DeadLetter(self._source(headers),
                                                    headers["onceflow.reason"]))
            elif out.topic == self.late_events_topic:
                self.late.append(LateEvent(
                    self._source(headers), headers["onceflow.stage"], (out.key or b"").decode(),
                    headers["onceflow.position"], headers["onceflow.reason"]))
            elif out.topic in self._hops:
                partition = partition_for(out.key, self._hops[out.topic])
                hop = Consumed(out.topic, partition, self._ends.get((out.topic, partition), 0),
                               out.value, out.key, out.headers)
                self._pending.append(self._append(hop))

    def _source(self, headers: Mapping[str, str]) -> Consumed:
        topic, partition, offset = headers["onceflow.source"].rsplit("/", 2)
        return self._at[(topic, int(partition), int(offset))]


def _reordered(records: list[Consumed], order: Callable[[list[Consumed]], Iterable[Consumed]]
               ) -> list[Consumed]:
    """``order(records)``, refused unless it keeps the records and each partition's order."""
    again = list(order(list(records)))
    def per_partition(found: list[Consumed]) -> dict[TopicPartition, list[int]]:
        split: dict[TopicPartition, list[int]] = {}
        for r in found:
            split.setdefault((r.topic, r.partition), []).append(r.offset)
        return split
    if per_partition(again) != per_partition(records):
        raise ValueError("order must keep every record and each partition's order")
    return again
