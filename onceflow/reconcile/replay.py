"""The pipeline replayed in memory with the worker's own rules, forgetting each record.

``Replay`` is a ``onceflow.testing.TestRun`` (the worker's ``PipelineRunner``
over a dict for a store) built with the worker's settings (``hold_new`` window
watermarks, state size bound, dead-letter value bound), that keeps no log of
the records it consumed: after each fed chunk the changed states move to its
store dict, so its memory grows with the keys (and closed windows), not with
the records. Its outputs are counted per topic, not kept. Repartition outputs
are not fed back (``TestRun`` feeds them back at once): the records the worker
consumed from a repartition topic are read from it, in its order, and fed
like the source's, so every segment folds what the worker's did, in the same
order, replays of a killed upstream included.

Key homes (several workers, ``single-worker = false``): which input partition
first claimed a key is a race between workers that the input does not record,
so a key's home is the one its stored state names (``homes``), and only a key
the store has no state of is homed where the replay meets it first.

Joins, and a single worker's aggregates over several source partitions, are folded
by the worker's ``JoinRunner`` over the runs of its merge log (``order``,
``reconcile.order``): the replay applies the input in the order the worker did,
whatever order the partitions are fetched in.

For ``reconcile.expiry`` (``timed``: a stage whose rows expire) it keeps each
record's Kafka timestamp (8 bytes a record, ``timestamp``), and for each closed
window the newest timestamp applied before the chunk in which it closed
(``closed_after``): lower bounds on when the worker wrote. And per key of a stage
whose states expire, the newest timestamp folded as of each chunk: where two
successive ones lie ``expire-after`` or more apart, the worker may have let the state
expire between them and started it afresh (``gaps``: the last such pair per key).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from onceflow.reconcile.expiry import lifetimes, newest_input
from onceflow.reconcile.order import Order
from onceflow.runtime.settings import Settings
from onceflow.stages.join_runner import JoinRunner
from onceflow.stages.outcome import BatchOutcome
from onceflow.stages.pipeline import Aggregate, Pipeline
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, TopicPartition, decode_state
from onceflow.testing import Consumed, TestRun
from onceflow.testing_records import Record

__all__ = ["HomeReader", "Replay"]

#: The stored homes of an aggregate's keys (keys without a stored home are left out).
HomeReader = Callable[[Aggregate, Sequence[str]], Mapping[str, TopicPartition]]


class Replay(TestRun):
    """One worker's folding of the input, in memory, with no record kept after its chunk."""

    def __init__(self, pipeline: Pipeline, settings: Settings, homes: HomeReader | None = None,
                 order: Order | None = None, timed: bool = True):
        self._settings = settings  # read by _new_runner, which TestRun.__init__ calls
        self._lives = {spec.id: life for spec in pipeline.aggregates
                       if (life := lifetimes(settings, spec).states)}  # seconds
        self._newest: dict[tuple[str, str], int] = {}  # (stage, key) -> ms, as of a chunk
        #: (stage, key) -> the newest timestamps (ms) of two successive chunks that folded
        #: into it ``expire-after`` or more apart: the state may have expired between.
        self.gaps: dict[tuple[str, str], tuple[int, int]] = {}
        self._stored_homes = homes
        self._order = order
        super().__init__(pipeline, single_worker=settings.single_worker,
                         dead_letter_topic=settings.kafka.dead_letter_topic,
                         late_events_topic=settings.kafka.late_events_topic,
                         idle_timeout=settings.windows.idle_timeout,
                         max_future=settings.windows.max_future)
        if order is not None:  # read by the runner at its first ordered record
            self.merge_log.append({p: list(runs) for p, runs in order.runs.items()})
        #: Records produced per topic (dead letters and late events included).
        self.sent: Counter[str] = Counter()
        self._stamps: dict[TopicPartition, tuple[int, array[int]]] = {}  # first offset, ms
        self._timed = timed  # keep the timestamps (only the expiry rules read them)
        self._applied: int | None = None  # the newest timestamp applied so far
        self._floor: int | None = None  # ... before the chunk being fed
        #: (stage, key, window start) -> the newest timestamp applied before it closed
        self.closed_after: dict[tuple[str, str, int], int | None] = {}

    def _new_runner(self) -> PipelineRunner | JoinRunner:
        s = self._settings
        kind: Any = PipelineRunner
        ordered: dict[str, Any] = {}
        if self._order is not None:  # from offset 0: every logged run below the commits
            kind = JoinRunner
            ordered = {"merge_log": self.merge_log, "positions": {},
                       "across": self._order.across}
        runner: PipelineRunner | JoinRunner = kind(
            self.pipeline, self.store.load, s.kafka.dead_letter_topic, s.kafka.late_events_topic,
            claim=None if s.single_worker else self._claim,
            load_sequences=self.store.load_sequences, load_rows=self.store.load_rows,
            idle_timeout=s.windows.idle_timeout, hold_new=True,
            max_future=s.windows.max_future,
            dead_letter_max_value=s.kafka.dead_letter_max_value,
            max_state_bytes=s.state.max_state_bytes, **ordered)
        return runner

    def _claim(self, spec: Aggregate, feeders: Mapping[str, TopicPartition]
               ) -> dict[str, TopicPartition]:
        """TestRun's claim (the first feeder wins), after the homes the store holds."""
        new = [key for key in feeders if (spec.id, key) not in self.store.homes]
        if new and self._stored_homes is not None:
            for key, home in self._stored_homes(spec, new).items():
                self.store.homes[(spec.id, key)] = home
        return self.store.claim(spec, feeders)

    def feed(self, records: Iterable[Record]) -> list[Consumed]:
        self._floor = self._applied
        return super().feed(records)

    def persist(self) -> None:
        for table in self.runner.tables:
            for key, start in table.closed:
                self.closed_after[(table.spec.id, key, start)] = self._floor
            life = self._lives.get(table.spec.id)
            if life and self._timed:
                self._note_gaps(table.spec.id, life * 1000, table.dirty, table.states)
        super().persist()

    def _note_gaps(self, stage: str, life_ms: float, changed: Iterable[str],
                   states: Mapping[str, AggregateState]) -> None:
        for key in changed:
            state = states.get(key)
            newest = None if state is None else newest_input(state, self.timestamp)
            if newest is None:
                continue
            before = self._newest.get((stage, key))
            if before is not None and newest - before >= life_ms:
                self.gaps[(stage, key)] = (before, newest)
            self._newest[(stage, key)] = newest

    def timestamp(self, topic: str, partition: int, offset: int) -> int | None:
        """The Kafka timestamp (ms) of the record read at ``offset`` (None: not read)."""
        first, stamps = self._stamps.get((topic, partition), (0, array("q")))
        at = offset - first
        return stamps[at] if 0 <= at < len(stamps) and stamps[at] >= 0 else None

    def _append(self, record: Consumed) -> Consumed:
        """Only the partition's next offset and the record's timestamp are kept."""
        tp = (record.topic, record.partition)
        self._ends[tp] = record.offset + 1
        if not self._timed:
            return record
        first, stamps = self._stamps.setdefault(tp, (record.offset, array("q")))
        stamps.extend([-1] * (record.offset - first - len(stamps)))  # offsets compacted away
        stamps.append(-1 if record.timestamp is None else record.timestamp)
        return record

    def _absorb(self, outcome: BatchOutcome, records: int) -> None:
        for tp, offset in outcome.next_offsets.items():
            self._processed[tp] = max(offset, self._processed.get(tp, 0))
            ms = self.timestamp(tp[0], tp[1], offset - 1) if self._timed else None
            if ms is not None and (self._applied is None or ms > self._applied):
                self._applied = ms
        self.counters += outcome.stats(records)
        for out in outcome.outputs:  # a repartition hop's records are read from its topic
            self.sent[out.topic] += 1

    def recomputed(self, stage_id: str) -> dict[str, AggregateState]:
        """Each key's recomputed state (after ``persist``), as the store would hold it."""
        return {key: decode_state(data) for key, data in self.store.stage_rows(stage_id).items()}

    def history(self, stage_id: str) -> Iterator[tuple[str, int, bytes]]:
        """The recomputed closed windows: (key, window start, final value)."""
        return self.store.stage_history(stage_id)
