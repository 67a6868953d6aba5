"""The checkpoint ledger: the one owner of "durable" and "committable".

Pure bookkeeping (no I/O, no threads): the actors tell it what happened and
ask it what may happen next (docs/architecture.md, "The checkpoint ledger").

- A batch was processed: its next offsets, and whether it handed outputs to
  the producer (each such hand-over is one numbered *send*).
- A checkpoint was taken: the pipeline actor encoded its dirty states; the
  checkpoint covers every batch processed so far (offsets and sends).
- Sends were settled: the producer answered a barrier; every send up to a
  number is acknowledged or durably in the outbox.
- A checkpoint was written: its states are in the store. Only the oldest
  unwritten checkpoint may be written, and only once its sends are settled.
- The outbox count changed; partitions were assigned, revoked or forgotten;
  offsets were committed.

What it answers: whether a checkpoint may be written now, which offsets
are committable (durable, for a partition this worker owns, and nothing in
the outbox), and on a new assignment which partitions' in-memory progress
can no longer be trusted. Forgetting a partition whose processed records are
not all written raises: the caller restarts from what is durable instead of
losing them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from onceflow.checkpoint.log_marks import LogMark
from onceflow.stages.state import TopicPartition


class LedgerError(RuntimeError):
    """The protocol was not followed: writing it anyway could lose or double records."""


@dataclass(frozen=True)
class Checkpoint:
    """What one snapshot makes durable once written.

    ``offsets``: per partition, the next offset to read; every record below
    it is folded into states of this checkpoint or an earlier one.
    ``sends``: the number of the last send handed to the producer before it.
    ``depends``: the partitions with records processed but not written when it was
    taken, whose folds its rows may hold: its writes are fenced on their epochs
    (docs/architecture.md, "Fencing").
    """

    number: int
    offsets: Mapping[TopicPartition, int]
    sends: int
    depends: frozenset[TopicPartition] = field(default=frozenset(), compare=False)
    #: Per partition advanced since the last checkpoint, its last processed record
    #: (``onceflow.checkpoint.log_marks``): written with the states, checked on assignment.
    marks: Mapping[TopicPartition, LogMark] = field(default_factory=dict, compare=False)


class Ledger:
    def __init__(self) -> None:
        self._processed: dict[TopicPartition, int] = {}
        self._sends = 0
        self._settled = 0
        self._taken: deque[Checkpoint] = deque()  # taken, not yet written, oldest first
        self._last_taken: Checkpoint = Checkpoint(0, {}, 0)
        self._durable: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}  # or the position an assignment began at
        self._owned: set[TopicPartition] = set()
        self._stale: set[TopicPartition] = set()  # reported by assigned(), not forgotten yet
        self._starts: dict[TopicPartition, int] = {}  # where each stale one resumes
        self._forgotten_at: dict[TopicPartition, int] = {}  # last checkpoint taken before
        self._outboxed = 0
        self._marks: dict[TopicPartition, LogMark] = {}  # last processed record, not taken yet

    # -- what happened ---------------------------------------------------

    def processed(self, next_offsets: Mapping[TopicPartition, int], sent: bool,
                  marks: Mapping[TopicPartition, LogMark] | None = None) -> int:
        """A batch was folded; ``sent`` when it handed outputs to the producer; ``marks``:
        the batch's last record per partition.

        Answers the number of the last send (the one to tag those outputs
        with). A replayed batch (offsets below what was processed) moves
        nothing back.
        """
        for tp, offset in next_offsets.items():
            if offset > self._processed.get(tp, -1):
                self._processed[tp] = offset
        if marks:
            for tp, mark in marks.items():
                if mark.offset + 1 == self._processed.get(tp):
                    self._marks[tp] = mark
        if sent:
            self._sends += 1
        return self._sends

    def take(self, *, dirty: bool, force: bool = False) -> Checkpoint | None:
        """A snapshot of the states is being taken; ``dirty`` when it holds rows.

        None when there is nothing to make durable (no rows, nothing processed
        since the last checkpoint) unless ``force``.
        """
        last = self._last_taken
        if not (dirty or force) and last.offsets == self._processed and last.sends == self._sends:
            return None
        checkpoint = Checkpoint(last.number + 1, dict(self._processed), self._sends,
                                frozenset(self.unwritten(self._processed)), self._marks)
        self._marks = {}
        self._taken.append(checkpoint)
        self._last_taken = checkpoint
        return checkpoint

    def settled(self, sends: int) -> None:
        """Every send numbered up to ``sends`` is acknowledged or in the outbox."""
        self._settled = max(self._settled, sends)

    def written(self, checkpoint: Checkpoint) -> None:
        """Every state of ``checkpoint`` is in the store."""
        if not self.writable(checkpoint):
            raise LedgerError(f"checkpoint {checkpoint.number} written out of order: "
                              f"{self.why_not_writable(checkpoint)}")
        self._taken.popleft()
        for tp, offset in checkpoint.offsets.items():
            if self._forgotten_at.get(tp, -1) >= checkpoint.number:
                continue  # taken before the partition was forgotten: not its progress now
            if offset > self._durable.get(tp, -1):
                self._durable[tp] = offset
        self._forgotten_at = {tp: n for tp, n in self._forgotten_at.items()
                              if n > checkpoint.number}

    def outboxed(self, delta: int) -> None:
        """Records entered (+) or left (-) the outbox."""
        self._outboxed += delta
        if self._outboxed < 0:
            raise LedgerError(f"outbox count below zero ({self._outboxed})")

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._committed.update(offsets)

    def assigned(self, positions: Mapping[TopicPartition, int],
                 moved: Iterable[TopicPartition] = ()) -> set[TopicPartition]:
        """Partitions now owned, each with the position the group resumes it from.

        Answers the partitions whose in-memory progress is stale: known here
        but resumed from elsewhere than this worker last committed (another
        member processed and committed them meanwhile), ``moved`` (their epoch
        says another member held them meanwhile, committed or not), or known
        here and not assigned again. The caller forgets them (nothing of them
        is committable until then); one still assigned stays owned and starts
        over at its position.
        """
        moved = set(moved)
        stale = {tp for tp in self._known() if tp not in positions or tp in moved
                 or positions[tp] != self._committed.get(tp, positions[tp])}
        self._owned = set(positions)
        self._stale = set(stale)  # the caller's copy is its own
        self._starts = {tp: positions[tp] for tp in stale if tp in positions}
        for tp, position in positions.items():
            if tp not in self._committed:
                self._committed[tp] = position
        return stale

    def unwritten(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of ``partitions`` with processed records not written yet."""
        return sorted(tp for tp in set(partitions) if tp in self._processed
                      and self._processed[tp] > self._durable.get(tp, -1))

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Revoked (after a final checkpoint and commit) or stale: drop their progress.

        Raises if some of it is not written yet: forgetting it would lose it.
        """
        partitions = set(partitions)
        unwritten = self.unwritten(partitions)
        if unwritten:
            raise LedgerError(f"forgetting {unwritten} would lose processed records that are "
                              "not written yet")
        for tp in partitions:
            self._processed.pop(tp, None)
            self._durable.pop(tp, None)
            self._marks.pop(tp, None)
            self._forgotten_at[tp] = self._last_taken.number
            if tp in self._starts:  # stale but still assigned: progress starts over there
                self._committed[tp] = self._starts.pop(tp)
            else:
                self._committed.pop(tp, None)
                self._owned.discard(tp)
        self._stale -= partitions
        # Replays after a re-assignment start again below the last checkpoint's offsets.
        last = self._last_taken
        self._last_taken = Checkpoint(last.number, {tp: o for tp, o in last.offsets.items()
                                                    if tp not in partitions}, last.sends)

    # -- what may happen next ---------------------------------------------

    def writable(self, checkpoint: Checkpoint) -> bool:
        """``checkpoint`` is the oldest unwritten one and its sends are settled."""
        return bool(self._taken) and self._taken[0] == checkpoint \
            and checkpoint.sends <= self._settled

    def why_not_writable(self, checkpoint: Checkpoint) -> str:
        if not self._taken or self._taken[0] != checkpoint:
            oldest = self._taken[0].number if self._taken else None
            return f"the oldest unwritten checkpoint is {oldest}"
        return f"sends up to {checkpoint.sends} are not settled (only {self._settled})"

    def committable(self) -> dict[TopicPartition, int]:
        """Durable offsets of owned partitions not committed yet; none while the
        outbox holds records (their inputs are behind them), and none of a stale
        partition before it is forgotten (its durable offset is this worker's
        old progress, maybe behind the group's)."""
        if self._outboxed:
            return {}
        return {tp: offset for tp, offset in self._durable.items()
                if tp in self._owned and tp not in self._stale
                and self._committed.get(tp) != offset}

    def processed_offsets(self) -> dict[TopicPartition, int]:
        return dict(self._processed)

    def owned(self) -> frozenset[TopicPartition]:
        """The partitions of the current assignment (what /health counts as this worker's)."""
        return frozenset(self._owned)

    @property
    def outbox_count(self) -> int:
        return self._outboxed

    def _known(self) -> set[TopicPartition]:
        return set(self._processed) | set(self._committed)

