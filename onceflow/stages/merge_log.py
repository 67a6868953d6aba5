"""The merge log: the order in which a co-partition's inputs were applied, and its replay.

A join reads two inputs, the stream and the table, and arrival order between two
partitions is not repeatable: after a crash the replayed stream records could meet
another version of the table than the first run did. The merge log holds no data,
only that order, as batch runs: "stream p offsets a..b, then table p offsets c..d".
Each run is appended (durably) *before* its records are applied; a restarted
incarnation replays the logged runs not below the inputs' committed offsets, in the
logged order, waiting for each run's records, up to the log's tip; from there on it
applies what arrives, in arrival order, logging each run first.

The same log orders a single worker's source partitions against each other
(``onceflow.single-worker = true``): there one order holds every partition of the
source topics, and each run names its partition (``Run.partition``), so a restarted
worker replays the partitions interleaved as the first run applied them, and a window
closes, or a value is judged late, at the same point.

Its position needs no commit of its own: the inputs' offsets are committed together
at batch boundaries, where every run handed to the runner was applied whole, so the
first logged run not below them (``CoPartition.__init__``) is where the replay starts.
Pure: the runner (``stages.join_runner``) does the I/O through a ``MergeLog``.
docs/architecture.md, "Joins: the merge log".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol

from onceflow.shared_types import ConsumedRecord
from onceflow.stages.pipeline import Pipeline


def needs_merge_log(pipeline: Pipeline, single_worker: bool, source_partitions: int | None
                    ) -> bool:
    """Whether a pipeline's results can depend on how its inputs' partitions interleave:
    it joins (a stream against its table), or one worker folds several source
    partitions (``source_partitions``, None: not known, counted as several) into its
    aggregates, where a key may be fed from more than one of them."""
    several = source_partitions is None or source_partitions > 1
    return bool(pipeline.joins) or (single_worker and bool(pipeline.aggregates) and several)


def ordered_topics(pipeline: Pipeline, across: bool) -> set[str]:
    """The topics whose records the log orders: every join's stream and table topics,
    and with ``across`` (a single worker's one order) the pipeline's source topics."""
    return {*(topic for _, topics in pipeline.joins for topic in topics),
            *(join.table.topic for join, _ in pipeline.joins),
            *(pipeline.topics if across else ())}


class Run(NamedTuple):
    """Records ``first..last`` (offsets, both included) of ``topic``, one input of the
    co-partition, applied together. ``partition``: the input's partition in a log that
    orders several partitions (a single worker's); None in a co-partition's log, whose
    partition is the log's own."""

    topic: str
    first: int
    last: int
    partition: int | None = None


#: An input of one order: a topic, and its partition when the order spans several.
Input = tuple[str, int | None]


class MergeLog(Protocol):
    """Where each co-partition's runs are kept: the Kafka topic of the worker
    (written by one writer per partition), or memory in ``onceflow.testing``."""

    def read(self, partition: int) -> list[Run]:
        """The runs logged for co-partition ``partition``, oldest first (all retained)."""
        ...

    def append(self, runs: Mapping[int, list[Run]]) -> None:
        """Log each co-partition's ``runs`` after its others; returns once all are
        durable (one round trip for a batch's co-partitions)."""
        ...


class MemoryMergeLog:
    """A merge log in memory that outlives the runners (``TestRun``'s crashes)."""

    def __init__(self) -> None:
        self.runs: dict[int, list[Run]] = {}

    def read(self, partition: int) -> list[Run]:
        return list(self.runs.get(partition, ()))

    def append(self, runs: Mapping[int, list[Run]]) -> None:
        for partition, logged in runs.items():
            self.runs.setdefault(partition, []).extend(logged)


class CoPartition:
    """Orders the records of partition ``p`` of every input of the joins, or with
    ``across`` every partition of every input (a single worker's one order).

    ``positions``: each input's next offset at the start (the committed one). Runs
    logged below them were applied and committed; the first one not below them is
    where the replay begins.
    """

    def __init__(self, logged: Iterable[Run], positions: Mapping[Input, int],
                 across: bool = False):
        self.across = across
        self.next: dict[Input, int] = dict(positions)  # input -> next offset to apply
        self.pending: deque[Run] = deque()  # logged runs not applied yet, in order
        for run in logged:
            if self.pending or run.last >= self.next.get((run.topic, run.partition), 0):
                self.pending.append(run)
        self.arrived: list[ConsumedRecord] = []  # records waiting, in arrival order
        self.seen: dict[Input, int] = {}  # input -> the highest offset arrived

    def input(self, record: ConsumedRecord) -> Input:
        return record.topic, record.partition if self.across else None

    def applied(self, record: ConsumedRecord) -> bool:
        """Below the input's next offset: applied already (by this incarnation or before
        the committed offsets)."""
        return record.offset < self.next.get(self.input(record), 0)

    def offer(self, record: ConsumedRecord) -> bool:
        """Take a record to order; False for one already applied or waiting (a re-delivery)."""
        source, offset = self.input(record), record.offset
        if offset < self.next.get(source, 0) or offset <= self.seen.get(source, -1):
            return False
        self.seen[source] = offset
        self.arrived.append(record)
        return True

    @property
    def replaying(self) -> bool:
        return bool(self.pending)

    def replayed(self) -> list[tuple[Run, list[ConsumedRecord]]]:
        """The logged runs whose records have all arrived, in the logged order; stops at the
        first that waits for records (a replay may deliver the inputs in another order)."""
        ready = []
        while self.pending:
            run = self.pending[0]
            source = (run.topic, run.partition)
            if not any(self.input(r) == source and r.offset >= run.last for r in self.arrived):
                break
            self.pending.popleft()
            ready.append((run, self._take(source, run.last)))
        return ready

    def fresh(self) -> list[tuple[Run, list[ConsumedRecord]]]:
        """Past the log's tip: what arrived, cut into runs of one input in arrival order
        (to be logged before they are applied)."""
        runs: list[tuple[Run, list[ConsumedRecord]]] = []
        for record in self.arrived:
            topic, partition = self.input(record)
            if runs and (runs[-1][0].topic, runs[-1][0].partition) == (topic, partition):
                runs[-1][1].append(record)
            else:
                runs.append((Run(topic, record.offset, record.offset, partition), [record]))
        self.arrived = []
        found = []
        for run, records in runs:
            found.append((run._replace(last=records[-1].offset), records))
            self.next[(run.topic, run.partition)] = records[-1].offset + 1
        return found

    def _take(self, source: Input, last: int) -> list[ConsumedRecord]:
        taken = [r for r in self.arrived if self.input(r) == source and r.offset <= last]
        self.arrived = [r for r in self.arrived if self.input(r) != source or r.offset > last]
        self.next[source] = last + 1
        return taken
