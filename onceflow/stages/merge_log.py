"""The merge log: the order in which a co-partition's inputs were applied, and its replay.

A join reads two inputs, the stream and the table, and arrival order between two
partitions is not repeatable: after a crash the replayed stream records could meet
another version of the table than the first run did. The merge log holds no data,
only that order, as batch runs: "stream p offsets a..b, then table p offsets c..d".
Each run is appended (durably) *before* its records are applied; a restarted
incarnation replays the logged runs not below the inputs' committed offsets, in the
logged order, waiting for each run's records, up to the log's tip; from there on it
applies what arrives, in arrival order, logging each run first.

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


class Run(NamedTuple):
    """Records ``first..last`` (offsets, both included) of ``topic``, one input of the
    co-partition, applied together."""

    topic: str
    first: int
    last: int


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
    """Orders the records of partition ``p`` of every input of the joins.

    ``positions``: each input's next offset at the start (the committed one). Runs
    logged below them were applied and committed; the first one not below them is
    where the replay begins.
    """

    def __init__(self, logged: Iterable[Run], positions: Mapping[str, int]):
        self.next: dict[str, int] = dict(positions)  # input -> next offset to apply
        self.pending: deque[Run] = deque()  # logged runs not applied yet, in order
        for run in logged:
            if self.pending or run.last >= self.next.get(run.topic, 0):
                self.pending.append(run)
        self.arrived: list[ConsumedRecord] = []  # records waiting, in arrival order
        self.seen: dict[str, int] = {}  # input -> the highest offset arrived

    def offer(self, record: ConsumedRecord) -> bool:
        """Take a record to order; False for one already applied (a re-delivery)."""
        topic, offset = record.topic, record.offset
        if offset < self.next.get(topic, 0) or offset <= self.seen.get(topic, -1):
            return False
        self.seen[topic] = offset
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
            if not any(r.topic == run.topic and r.offset >= run.last for r in self.arrived):
                break
            self.pending.popleft()
            ready.append((run, self._take(run.topic, run.last)))
        return ready

    def fresh(self) -> list[tuple[Run, list[ConsumedRecord]]]:
        """Past the log's tip: what arrived, cut into runs of one input in arrival order
        (to be logged before they are applied)."""
        runs: list[tuple[Run, list[ConsumedRecord]]] = []
        for record in self.arrived:
            if runs and runs[-1][0].topic == record.topic:
                runs[-1][1].append(record)
            else:
                runs.append((Run(record.topic, record.offset, record.offset), [record]))
        self.arrived = []
        found = []
        for run, records in runs:
            found.append((run._replace(last=records[-1].offset), records))
            self.next[run.topic] = records[-1].offset + 1
        return found

    def _take(self, topic: str, last: int) -> list[ConsumedRecord]:
        taken = [r for r in self.arrived if r.topic == topic and r.offset <= last]
        self.arrived = [r for r in self.arrived if r.topic != topic or r.offset > last]
        self.next[topic] = last + 1
        return taken
