"""Runs a pipeline with join steps: the table records and the merge log around the runner.

The record path stays the runner's (``stages.runner``, compiled): each join step becomes
a map step (and a filter before it for ``missing="drop"``) that looks the value's key up
in the join's table (``stages.join_table``). What is new lives here, in front of it:
the records of the joins' inputs (the topics feeding the join steps and the table
topics) are ordered per co-partition by the merge log (``stages.merge_log``): logged
runs are replayed in their order, new ones logged before they are applied; a stream
run goes through the runner with the table's cursor where the merge order puts it, a
table run is applied to the table. Records of other topics go straight to the runner.

With ``across`` (a single worker, ``onceflow.single-worker = true``) the source topics
are ordered too, and every partition of every ordered input is one order (merge log
partition 0, each run naming its partition): a key fed from several partitions then
meets them, after a crash, interleaved as the first run met them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, replace
from typing import Any

from onceflow import faults
from onceflow.shared_types import ConsumedRecord, TopicPartition
from onceflow.stages.join_step import Join
from onceflow.stages.join_table import JoinTable, Loader
from onceflow.stages.merge_log import (
    Append,
    CoPartition,
    LogStarts,
    MergeLog,
    Run,
    Start,
    ordered_topics,
)
from onceflow.stages.outcome import BatchOutcome
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.republish import WrittenOutputs
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.side_outputs import SideOutputs
from onceflow.stages.state import MAX_STATE_BYTES
from onceflow.stages.state_table import StateTable
from onceflow.stages.steps import Filter, Map, Step


class NotCoAssigned(RuntimeError):
    """Partition ``p`` of a join's stream and of its table are not on one worker."""


class JoinRunner:
    """A ``PipelineRunner`` (``inner``) with the joins' tables and merge order around it.

    ``positions``: each input partition's next offset at the start (the committed ones);
    the inputs' partitions not named start at 0 (or at their first record delivered).
    ``across``: one order over every partition of the source topics and the joins'
    inputs (a single worker), instead of one per co-partition. ``log_starts``: the
    stored ``Start`` of the co-partitions asked for (``take_log_starts`` writes them).
    """

    def __init__(self, pipeline: Pipeline, load: Loader, dead_letter_topic: str,
                 *args: Any, merge_log: MergeLog,
                 positions: Mapping[TopicPartition, int] | None = None, across: bool = False,
                 log_starts: Callable[[list[int]], Mapping[int, Start]] | None = None,
                 **kwargs: Any):
        self.pipeline = pipeline
        self.naive = faults.NO_MERGE_LOG  # arrival order, the newest row: what the log fixes
        max_bytes = kwargs.get("max_state_bytes", MAX_STATE_BYTES)
        self.joins = {join.id: JoinTable(join, load, max_bytes, self.naive,
                                         kwargs.get("max_states"))
                      for join, _ in pipeline.joins}
        self._tables = {t.join.table.topic: t for t in self.joins.values()}
        self._streams = {topic for _, topics in pipeline.joins for topic in topics}
        self.across = across
        self._ordered = ordered_topics(pipeline, across)
        self._log = merge_log
        self._stored_starts = log_starts or (lambda numbers: {})
        self._starts = LogStarts()
        self._positions = dict(positions or {})
        for tp, offset in self._positions.items():
            if tp[0] in self._tables:
                self._tables[tp[0]].committed(tp[1], offset)
                self._tables[tp[0]].cursor[tp[1]] = offset
        self._groups: dict[int, CoPartition] = {}
        self.inner = PipelineRunner(replace(pipeline, steps=tuple(self._steps())), load,
                                    dead_letter_topic, *args, **kwargs)
        self.replays = 0  # records of the joins' inputs delivered again, dropped here

    @property
    def tables(self) -> list[StateTable]:
        """The aggregates' tables, then the joins' (persisted the same way)."""
        return [*self.inner.tables, *(t.table for t in self.joins.values())]

    @property
    def clocks(self) -> Any:
        return self.inner.clocks

    @property
    def sequences(self) -> Any:
        return self.inner.sequences

    @property
    def unreplayed(self) -> list[Run]:
        """Logged runs not applied yet: their records have not all arrived (a reader that
        stopped short of them, ``onceflow reconcile``'s, sees what was left out)."""
        return [run for group in self._groups.values() for run in group.pending]

    def process(self, records: Iterable[ConsumedRecord]) -> BatchOutcome:
        """Apply a batch: other topics' records as the runner does; the joins' inputs in
        merge order, each co-partition as far as its logged runs' records have arrived."""
        outcome = BatchOutcome()
        others: list[ConsumedRecord] = []
        touched: dict[int, CoPartition] = {}
        joined = {*self._streams, *self._tables}
        for record in records:
            topic = record.topic
            if topic not in self._ordered:
                others.append(record)
                continue
            number = 0 if self.across else record.partition
            group = touched[number] = self._group(number)
            if group.offer(record):
                continue
            if topic in joined or not group.applied(record):
                self.replays += 1  # the join's inputs: applied, or waiting in the replay
            else:  # applied: the runner discards it as a duplicate, counted as without a log
                others.append(record)
        if others:
            _add(outcome, self.inner.process(others))
        ordered: dict[int, list[tuple[Run, list[ConsumedRecord]]]] = {}
        fresh: dict[int, list[Run]] = {}  # logged at once, before any of them applies
        for partition, group in sorted(touched.items()):
            runs = ordered[partition] = group.replayed()
            if not group.replaying:
                new = group.fresh()
                if new and not self.naive:
                    fresh[partition] = [run for run, _ in new]
                runs += new
        if fresh:
            for number, append in self._log.append(fresh).items():
                self._starts.appended(number, append)
        for partition, runs in ordered.items():
            for run, batch in runs:
                self._apply(partition, run, batch, outcome)
        return outcome

    @property
    def written(self) -> WrittenOutputs:
        return self.inner.written

    @property
    def side(self) -> SideOutputs:
        return self.inner.side

    def assigned(self, partitions: Iterable[TopicPartition],
                 generations: Mapping[TopicPartition, int] | None = None) -> None:
        self.inner.assigned(partitions, generations)

    def start(self, positions: Mapping[TopicPartition, int]) -> None:
        """An assignment (the worker's): where each input partition resumes. Partition ``p``
        of every input must be here together (``NotCoAssigned`` otherwise); their
        co-partitions read their merge logs again at their next record."""
        inputs = {*self._streams, *self._tables}
        mine = {tp: offset for tp, offset in positions.items() if tp[0] in self._ordered}
        numbers: dict[int, set[str]] = {}
        for topic, partition in mine:
            if topic in inputs:
                numbers.setdefault(partition, set()).add(topic)
        for partition, topics in sorted(numbers.items()):
            if topics != inputs:
                raise NotCoAssigned(
                    f"partition {partition} of {sorted(inputs - topics)} is not assigned "
                    f"with partition {partition} of {sorted(topics)}: a join needs partition "
                    "p of its stream and table on one worker (every member must use the "
                    "range assignor, runtime/join_setup.JOIN_ASSIGNOR)")
        for (topic, partition), offset in mine.items():
            if offset < 0:
                raise NotCoAssigned(f"{topic}[{partition}] has no known position: the merge "
                                    "log cannot be replayed from it")
            self._positions[(topic, partition)] = offset
            table = self._tables.get(topic)
            if table is not None:
                table.committed(partition, offset)
                table.cursor[partition] = offset
            self._groups.pop(0 if self.across else partition, None)
            self._starts.forget(0 if self.across else partition)

    def advance(self) -> None:
        self.inner.advance()

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Offsets committed: table versions, and merge log appends, below them are no
        longer needed."""
        for (topic, partition), offset in offsets.items():
            if topic in self._tables:
                self._tables[topic].committed(partition, offset)
        # an input idle since the assignment is at its position (committed before it)
        self._starts.committed({**self._positions, **offsets})

    def take_log_starts(self) -> dict[int, Start]:
        """Where each co-partition's log may be read from next, where that moved."""
        return self._starts.take()

    def forget(self) -> None:
        """Drop every cached state and the merge order (re-read at the next start)."""
        self.inner.forget()
        for join in self.joins.values():
            join.table.clear()
        self._groups.clear()
        self._starts = LogStarts()

    def _group(self, number: int) -> CoPartition:
        """Co-partition ``number``'s order (with ``across``: the one order, number 0)."""
        group = self._groups.get(number)
        if group is None:
            across = self.across
            positions = {(topic, p if across else None): offset
                         for (topic, p), offset in self._positions.items()
                         if (across or p == number) and topic in self._ordered}
            # a run of a topic no longer ordered, or of the other shape of log (a pipeline
            # changed), orders nothing
            start = self._stored_starts([number]).get(number)
            appends = [] if self.naive else [
                Append(a.offset, a.epoch, [run for run in a.runs if run.topic in self._ordered
                                           and (run.partition is not None) == across])
                for a in self._log.read(number, start)]
            self._starts.read(number, start, appends)
            group = self._groups[number] = CoPartition(
                [run for a in appends for run in a.runs], positions, across)
        return group

    def _apply(self, number: int, run: Run, batch: list[ConsumedRecord],
               outcome: BatchOutcome) -> None:
        partition = number if run.partition is None else run.partition
        table = self._tables.get(run.topic)
        if table is not None:
            table.apply(batch, outcome, lambda record, failure: self.inner._dead_letter(
                outcome, record, failure))
            table.cursor[partition] = run.last + 1
            outcome.next_offsets[(run.topic, partition)] = run.last + 1
            return
        for join in self.joins.values():
            join.partition = partition
        _add(outcome, self.inner.process(batch))

    def _steps(self) -> list[Step]:
        """The pipeline's steps with each join as the runner's map (and filter)."""
        steps: list[Step] = []
        for step in self.pipeline.steps:
            if not isinstance(step, Join):
                steps.append(step)
                continue
            table = self.joins[step.id]
            if step.missing == "drop":
                steps.append(Filter(f"{step.id}.has-row", table.has_row))
            steps.append(Map(step.id, table.enrich))
        return steps


def _add(total: BatchOutcome, part: BatchOutcome) -> None:
    """Add one runner call's outcome to the batch's: lists extend, counts add, offsets and
    first reasons as the runner keeps them."""
    for field in fields(BatchOutcome):
        name = field.name
        mine, theirs = getattr(total, name), getattr(part, name)
        if isinstance(mine, list):
            mine.extend(theirs)
        elif isinstance(mine, int):
            setattr(total, name, mine + theirs)
        elif name == "next_offsets":
            mine.update(theirs)
        elif name in ("misaligned_reason", "first_rejection"):
            for key, value in theirs.items():
                mine.setdefault(key, value)
        else:  # Counters, and exclusive_skipped (topic -> count)
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0) + value
