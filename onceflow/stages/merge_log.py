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
What is read of the log is bounded all the same (``LogStarts``): once offsets are
committed, the first append holding a run not below them is where the next reader
starts, kept with the snapshot (``MERGE_LOG_STAGE``), so a long-lived worker's log,
appended at every batch, is not read whole at each assignment.
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


class Append(NamedTuple):
    """One append of a co-partition's log: where it lies, its writer's epoch, its runs
    (none for a reader's mark or a forget record)."""

    offset: int
    epoch: int
    runs: list[Run]


class Start(NamedTuple):
    """Where a reader of a co-partition's log may start: no append before ``offset``
    holds a run it needs; ``epoch``, the highest epoch of the appends before it (an
    append of a lower epoch past it is a zombie's, dropped as a whole read drops it)."""

    offset: int
    epoch: int


class MergeLog(Protocol):
    """Where each co-partition's runs are kept: the Kafka topic of the worker
    (written by one writer per partition), or memory in ``onceflow.testing``."""

    def read(self, partition: int, start: Start | None = None) -> list[Append]:
        """The appends of co-partition ``partition`` from ``start`` on (None: all
        retained), oldest first, a zombie's late ones dropped."""
        ...

    def append(self, runs: Mapping[int, list[Run]]) -> dict[int, Append]:
        """Log each co-partition's ``runs`` after its others; returns once all are
        durable (one round trip for a batch's co-partitions), with where each lies."""
        ...


class Logged(NamedTuple):
    """A record of a merge log as it lies: an append (``runs``), a reader's mark (``after``:
    the end it read to; nothing of a lower epoch from there on counts), or a forget
    record (``forgotten``: the runs of that topic logged before it order nothing)."""

    offset: int
    epoch: int
    runs: list[Run]
    after: int | None = None
    forgotten: str | None = None


def kept_appends(records: Iterable[Logged], highest: int = 0) -> list[Append]:
    """A partition's records as appends in order, without a zombie's late appends: a
    record of an epoch below one before it (``highest``: the highest epoch before the
    first record, where a read starts past the log's start), or at or past a reader's
    mark of a higher epoch (written by the successor right after it read the log, so an
    append that landed between its read and its mark is dropped too), and without the
    runs of a forgotten topic logged before its forget record."""
    kept: list[Append] = []
    for offset, epoch, runs, after, forgotten in records:
        if epoch < highest:
            continue
        highest = epoch
        if after is not None:
            kept = [k for k in kept if k.offset < after or k.epoch >= epoch]
        if forgotten is not None:
            kept = [k._replace(runs=[run for run in k.runs if run.topic != forgotten])
                    for k in kept]
        kept.append(Append(offset, epoch, runs))
    return kept


class MemoryMergeLog:
    """A merge log in memory that outlives the runners (``TestRun``'s crashes). Kept as the
    topic keeps it: each append under the writer's ``epoch`` (``TestRun`` counts it up at
    each crash, as a new owner takes a higher one), each read leaves its mark, and a read
    from a start keeps what ``kept_appends`` keeps."""

    def __init__(self) -> None:
        self.logged: dict[int, list[Logged]] = {}
        self.epoch = 0

    @property
    def runs(self) -> dict[int, list[Run]]:
        """Each partition's runs as a whole read gives them."""
        return {p: [run for a in kept_appends(logged) for run in a.runs]
                for p, logged in self.logged.items()}

    def read(self, partition: int, start: Start | None = None) -> list[Append]:
        logged = self.logged.setdefault(partition, [])
        found = kept_appends(logged[0 if start is None else start.offset:],
                             0 if start is None else start.epoch)
        logged.append(Logged(len(logged), self.epoch, [], after=len(logged)))
        return found

    def append(self, runs: Mapping[int, list[Run]]) -> dict[int, Append]:
        written = {}
        for partition, found in runs.items():
            logged = self.logged.setdefault(partition, [])
            logged.append(Logged(len(logged), self.epoch, list(found)))
            written[partition] = Append(len(logged) - 1, self.epoch, list(found))
        return written


class LogStarts:
    """Where each co-partition's log may next be read from (``Start``), moved on as
    offsets are committed: the appends this runner read or wrote, oldest first, until
    every run of one is below the committed offsets."""

    def __init__(self) -> None:
        self._appends: dict[int, deque[Append]] = {}
        self._epochs: dict[int, int] = {}  # number -> the highest epoch before its start
        self._next: dict[int, int] = {}  # number -> the start a reader may take now
        self._dirty: dict[int, Start] = {}

    def read(self, number: int, start: Start | None, appends: list[Append]) -> None:
        """Co-partition ``number``'s log as read from ``start``."""
        self._appends[number] = deque(appends)
        self._epochs[number] = start.epoch if start else 0
        self._next[number] = start.offset if start else 0

    def appended(self, number: int, append: Append) -> None:
        self._appends[number].append(append)

    def committed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """``offsets`` (next offset per input partition) are committed: appends all of
        whose runs lie below them are needed by no reader again.

        The start's epoch is the highest of the appends it passes, never of one past it:
        a reader drops what lies past the start below that epoch, and the appends of the
        member before this one (a lower epoch) may still hold runs to replay there."""
        for number, appends in self._appends.items():
            start, epoch = self._next[number], self._epochs[number]
            while appends and all(
                    run.last < offsets.get((run.topic, number if run.partition is None
                                            else run.partition), 0) for run in appends[0].runs):
                passed = appends.popleft()
                start, epoch = passed.offset + 1, max(epoch, passed.epoch)
            if appends:
                start = appends[0].offset
            if start != self._next[number]:  # lower only where the log was re-created
                self._next[number], self._epochs[number] = start, epoch
                self._dirty[number] = Start(start, epoch)

    def forget(self, number: int) -> None:
        """Co-partition ``number`` is read again (a new assignment)."""
        for kept in (self._appends, self._epochs, self._next, self._dirty):
            kept.pop(number, None)

    def take(self) -> dict[int, Start]:
        """The starts moved since the last take (to be written with a snapshot)."""
        taken, self._dirty = self._dirty, {}
        return taken


def encode_start(start: Start) -> bytes:
    return f"{start.offset} {start.epoch}".encode()


def decode_start(row: bytes) -> Start | None:
    """A stored start; None for a row that is none (the log is then read whole)."""
    try:
        offset, epoch = (int(part) for part in row.decode().split())
    except ValueError:
        return None
    return Start(offset, epoch) if offset >= 0 and epoch >= 0 else None


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
