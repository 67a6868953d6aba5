"""The checkpoint ledger (onceflow.checkpoint.ledger): examples of its API, then a
model-based property test over random interleavings of what the actors tell it.

The model keeps a small world next to the ledger: the pipeline actor's cached
states (per key, the set of records folded), the snapshots taken and not written yet,
the durable store, the producer's sends and outbox, the group's committed
offsets and another member that may process partitions while this worker does
not own them. Every decision the ledger answers is checked against that world.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from onceflow.checkpoint.ledger import Checkpoint, Ledger, LedgerError
from onceflow.stages.state import TopicPartition

A: TopicPartition = ("t", 0)
B: TopicPartition = ("t", 1)


def _fingerprint(ledger: Ledger) -> dict[str, Any]:
    """Everything the ledger holds: a refused call must leave it unchanged."""
    return copy.deepcopy(vars(ledger))


# -- examples ---------------------------------------------------------------


def test_take_answers_none_when_there_is_nothing_new() -> None:
    ledger = Ledger()
    assert ledger.take(dirty=False) is None
    ledger.processed({A: 3}, sent=False)
    assert ledger.take(dirty=False) == Checkpoint(1, {A: 3}, 0)
    assert ledger.take(dirty=False) is None
    assert ledger.take(dirty=True) == Checkpoint(2, {A: 3}, 0)
    assert ledger.take(dirty=False, force=True) == Checkpoint(3, {A: 3}, 0)
    assert ledger.processed({A: 3}, sent=True) == 1  # a send alone is something new
    assert ledger.take(dirty=False) == Checkpoint(4, {A: 3}, 1)
    assert ledger.take(dirty=False) is None


def test_checkpoints_are_written_oldest_first_and_after_their_sends_settle() -> None:
    ledger = Ledger()
    ledger.processed({A: 2}, sent=False)
    first = ledger.take(dirty=True)
    second = ledger.take(dirty=False, force=True)
    assert first is not None and second is not None
    assert not ledger.writable(second)
    with pytest.raises(LedgerError, match="out of order"):
        ledger.written(second)
    ledger.written(first)
    ledger.written(second)
    with pytest.raises(LedgerError):  # written twice
        ledger.written(second)

    assert ledger.processed({A: 4}, sent=True) == 1
    third = ledger.take(dirty=True)
    assert third is not None and third.sends == 1
    assert not ledger.writable(third)
    with pytest.raises(LedgerError, match="not settled"):
        ledger.written(third)
    ledger.settled(1)
    ledger.written(third)


def test_committable_waits_for_an_empty_outbox_and_lists_only_owned_partitions() -> None:
    ledger = Ledger()
    assert ledger.assigned({A: 0}) == set()
    ledger.processed({A: 5, B: 7}, sent=False)
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None
    assert ledger.committable() == {}  # nothing durable yet
    ledger.written(checkpoint)
    assert ledger.committable() == {A: 5}  # B is not owned
    ledger.outboxed(+2)
    assert ledger.committable() == {}
    ledger.outboxed(-1)
    assert ledger.committable() == {}
    ledger.outboxed(-1)
    assert ledger.committable() == {A: 5}
    ledger.committed({A: 5})
    assert ledger.committable() == {}
    with pytest.raises(LedgerError, match="below zero"):
        ledger.outboxed(-1)


def test_assigned_reports_partitions_resumed_from_elsewhere_or_not_assigned_again() -> None:
    ledger = Ledger()
    assert ledger.assigned({A: 0, B: 0}) == set()
    ledger.processed({A: 4, B: 2}, sent=False)
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None
    ledger.written(checkpoint)
    due = ledger.committable()
    assert due == {A: 4, B: 2}
    ledger.committed(due)
    assert ledger.assigned({A: 4, B: 2}) == set()  # back where this worker committed
    assert ledger.assigned({A: 9, B: 2}) == {A}  # another member committed A meanwhile
    assert ledger.assigned({B: 2}) == {A}  # A is known here and not assigned again


def test_forget_refuses_unwritten_records_then_works_once_written() -> None:
    ledger = Ledger()
    ledger.assigned({A: 0, B: 0})
    ledger.processed({A: 3, B: 1}, sent=False)
    before = _fingerprint(ledger)
    with pytest.raises(LedgerError, match="not written"):
        ledger.forget([A])
    assert _fingerprint(ledger) == before
    assert ledger.unwritten([A, B]) == [A, B]
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None
    with pytest.raises(LedgerError):  # taken is not written
        ledger.forget([A])
    ledger.written(checkpoint)
    assert ledger.unwritten([A, B]) == []
    ledger.forget([A])
    assert ledger.processed_offsets() == {B: 1}
    assert ledger.committable() == {B: 1}


def test_a_replayed_batch_does_not_move_processed_back() -> None:
    ledger = Ledger()
    ledger.processed({A: 10}, sent=False)
    ledger.processed({A: 4, B: 2}, sent=False)
    assert ledger.processed_offsets() == {A: 10, B: 2}
    checkpoint = ledger.take(dirty=False)
    assert checkpoint is not None and checkpoint.offsets == {A: 10, B: 2}


# -- a partition resumed from elsewhere (ConsumerActor.resume, PipelineActor._forget) --
# Found by the state machine below.


def test_a_stale_partition_assigned_again_stays_owned_and_becomes_committable() -> None:
    ledger = Ledger()
    ledger.assigned({A: 0})
    assert ledger.assigned({A: 5}) == {A}  # another member committed A at 5 meanwhile
    ledger.forget({A})  # the pipeline actor drops its cached states; A is still assigned
    ledger.processed({A: 8}, sent=False)
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None
    ledger.written(checkpoint)
    assert ledger.committable() == {A: 8}


def test_a_stale_partition_moved_again_before_a_commit_is_stale_again() -> None:
    ledger = Ledger()
    ledger.assigned({A: 0})
    assert ledger.assigned({A: 5}) == {A}
    ledger.forget({A})
    ledger.processed({A: 7}, sent=False)  # cached states of A, nothing committed yet
    # The stream is away again; another member resumes A at 5, commits 9.
    assert ledger.assigned({A: 9}) == {A}


def test_nothing_of_a_stale_partition_is_committable_before_it_is_forgotten() -> None:
    ledger = Ledger()
    ledger.assigned({A: 0})
    ledger.processed({A: 1}, sent=False)
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None
    ledger.written(checkpoint)
    ledger.committed(ledger.committable())
    assert ledger.assigned({A: 3}) == {A}  # another member committed A at 3
    # The commit actor ticks before the pipeline actor forgets A: committing the
    # old durable 1 would move the group back from 3.
    assert all(offset >= 3 for offset in ledger.committable().values())


def test_a_checkpoint_written_after_forget_makes_nothing_of_the_forgotten_durable() -> None:
    ledger = Ledger()
    ledger.assigned({A: 0, B: 0})
    ledger.processed({A: 3}, sent=False)
    first = ledger.take(dirty=True)
    assert first is not None
    ledger.written(first)
    ledger.committed(ledger.committable())
    ledger.processed({B: 1}, sent=True)  # its send is not settled yet
    pending = ledger.take(dirty=True)
    assert pending is not None
    ledger.forget({A})  # revoked: all of A is written (the pending checkpoint holds A: 3)
    ledger.settled(1)
    ledger.written(pending)
    assert ledger.assigned({A: 8, B: 0}) == set()  # another member committed A at 8
    assert ledger.committable() == {B: 1}  # not A: 3, behind the group


# -- the model ----------------------------------------------------------------

PARTITIONS: tuple[TopicPartition, ...] = (("t", 0), ("t", 1), ("t", 2))
# Keys are homed to a partition (as the aggregates' homes make them): only its owner folds them.
KEYS: dict[TopicPartition, tuple[str, ...]] = {
    tp: (f"k{tp[1]}a", f"k{tp[1]}b") for tp in PARTITIONS}
Rec = tuple[TopicPartition, int]  # one input record: (partition, offset)
SendId = tuple[int, int]  # (epoch of the ledger, send number)
OTHER: SendId = (-1, 0)  # outputs produced by another member (settled as far as we know)


class LedgerMachine(RuleBasedStateMachine):
    """One worker's ledger driven like the actors drive it, next to a model of the world.

    An *epoch* is one ledger: a core restart (the pipeline actor failed) starts a
    new one from what is durable. Records fold idempotently (a replayed record
    already in a state changes nothing and produces nothing), as the watermarks
    of the states make it.
    """

    def __init__(self) -> None:
        super().__init__()
        # The world, which outlives a restart.
        self.store: dict[str, frozenset[Rec]] = {}
        self.group: dict[TopicPartition, int] = dict.fromkeys(PARTITIONS, 0)
        self.folded_by: dict[Rec, frozenset[str]] = {}
        self.emits: dict[Rec, bool] = {}
        self.seen: set[Rec] = set()  # processed by anyone, ever
        self.derived: dict[Rec, list[SendId]] = {}  # sends carrying a record's outputs
        self.settled_in: dict[int, int] = {OTHER[0]: OTHER[1]}
        self.outbox: list[int] = []  # settled sends' outputs not delivered yet
        self.ever_committable: dict[TopicPartition, int] = {}
        # This worker; an epoch's state.
        self.epoch = 0
        self.ledger = Ledger()
        self.owned: set[TopicPartition] = set()
        self.next: dict[TopicPartition, int] = {}  # the consumer's position
        self.mem: dict[str, set[Rec]] = {}  # cached states
        self.dirty: set[str] = set()
        self.pending: deque[tuple[Checkpoint, dict[str, frozenset[Rec]]]] = deque()
        self.written_cps: list[Checkpoint] = []
        self.sends = 0
        self.settled = 0
        self.send_records: dict[int, frozenset[Rec]] = {}
        self.processed_to: dict[TopicPartition, int] = {}
        self.known: set[TopicPartition] = set()  # progress held here (until forgotten)
        self.foreign: set[TopicPartition] = set()  # known, and another member moved it since
        self.my_pos: dict[TopicPartition, int] = {}  # last committed here, or assigned at

    # -- helpers ---------------------------------------------------------

    def _first_sight(self, data: st.DataObject, record: Rec) -> None:
        if record not in self.folded_by:
            keys = data.draw(st.sets(st.sampled_from(KEYS[record[0]]), min_size=1))
            self.folded_by[record] = frozenset(keys)
            self.emits[record] = data.draw(st.booleans())

    def _load(self, key: str) -> set[Rec]:
        if key not in self.mem:
            self.mem[key] = set(self.store.get(key, frozenset()))
        return self.mem[key]

    def _take(self, force: bool) -> None:
        checkpoint = self.ledger.take(dirty=bool(self.dirty), force=force)
        if checkpoint is None:
            assert not self.dirty and not force
            return
        assert dict(checkpoint.offsets) == self.processed_to
        assert checkpoint.sends == self.sends
        snapshot = {key: frozenset(self.mem[key]) for key in self.dirty}  # encoded: copies
        self.pending.append((checkpoint, snapshot))
        self.dirty.clear()

    def _settle(self, data: st.DataObject, upto: int) -> None:
        """The producer: each send up to ``upto`` acknowledged, or into the outbox."""
        for number in range(self.settled + 1, upto + 1):
            if data.draw(st.booleans(), label=f"send {number} goes to the outbox"):
                count = len(self.send_records[number])
                self.outbox.append(count)
                self.ledger.outboxed(+count)
        self.ledger.settled(upto)
        self.settled = max(self.settled, upto)
        self.settled_in[self.epoch] = self.settled

    def _write_oldest(self) -> None:
        checkpoint, states = self.pending.popleft()
        assert self.ledger.writable(checkpoint)
        self.store.update(states)
        self.ledger.written(checkpoint)
        self.written_cps.append(checkpoint)

    def _assert_durable(self, tp: TopicPartition, offset: int) -> None:
        for record in self.seen:
            if record[0] == tp and record[1] < offset:
                for key in self.folded_by[record]:
                    assert record in self.store.get(key, frozenset()), (
                        f"{record} below {offset} is not in the stored state of {key}")

    def _assert_sends_settled(self, tp: TopicPartition, offset: int) -> None:
        for record, sends in self.derived.items():
            if record[0] == tp and record[1] < offset:
                for epoch, number in sends:
                    if epoch == self.epoch:
                        assert number <= self.settled, f"send {number} of {record} not settled"
                epoch, number = sends[-1]  # an earlier epoch's send is replaced by a replay's
                assert number <= self.settled_in.get(epoch, 0), (
                    f"the last send of {record} ({epoch}, {number}) was never settled")

    def _unwritten_states(self, parts: set[TopicPartition]) -> set[TopicPartition]:
        """Partitions with a folded record in memory that the store does not hold."""
        return {tp for tp in parts for key in KEYS[tp]
                if key in self.mem and not self.mem[key] <= self.store.get(key, frozenset())}

    def _commit(self) -> None:
        due = self.ledger.committable()
        for tp, offset in due.items():
            assert tp in self.owned, f"committable lists {tp}, not owned"
            assert not self.outbox, f"committable lists {due} while the outbox holds records"
            assert offset >= self.group[tp], (
                f"committing {tp} at {offset} moves the group back from {self.group[tp]}")
            self._assert_durable(tp, offset)
            self._assert_sends_settled(tp, offset)
            self.ever_committable[tp] = max(self.ever_committable.get(tp, 0), offset)
        self.ledger.committed(due)
        self.group.update(due)
        self.my_pos.update(due)

    def _forget(self, parts: set[TopicPartition], drop_all: bool) -> bool:
        """``ledger.forget``, then the pipeline actor drops cached states. False if refused."""
        unwritten = self._unwritten_states(parts)
        before = _fingerprint(self.ledger)
        try:
            self.ledger.forget(parts)
        except LedgerError:
            assert _fingerprint(self.ledger) == before
            return False
        assert not unwritten, f"forget({sorted(parts)}) lost the unwritten states of {unwritten}"
        for tp in parts:
            self._assert_durable(tp, self.processed_to.get(tp, 0))
        assert not self.dirty
        if drop_all:
            assert not self.pending
            self.mem.clear()
        else:
            for tp in parts:
                for key in KEYS[tp]:
                    self.mem.pop(key, None)
        for tp in parts:
            self.processed_to.pop(tp, None)
            self.known.discard(tp)
            self.foreign.discard(tp)
            self.my_pos.pop(tp, None)
        return True

    def _restart(self) -> None:
        """The core restarts: a new ledger; states reload from the store; the group resumes."""
        self.epoch += 1
        self.ledger = Ledger()
        self.mem.clear()
        self.dirty.clear()
        self.pending.clear()
        self.written_cps.clear()
        self.sends = self.settled = 0
        self.send_records.clear()
        self.processed_to.clear()
        self.foreign.clear()
        if self.outbox:  # the outbox is durable: its records are adopted and counted again
            self.ledger.outboxed(sum(self.outbox))
        positions = {tp: self.group[tp] for tp in sorted(self.owned)}
        assert self.ledger.assigned(positions) == set()
        self.known = set(positions)
        self.my_pos = dict(positions)
        self.next = dict(positions)

    def _other_member(self, data: st.DataObject, tp: TopicPartition, count: int) -> None:
        """Another member processes ``count`` records of ``tp``, writes and commits them."""
        start = self.group[tp]
        for record in [(tp, x) for x in range(start, start + count)]:
            self._first_sight(data, record)
            for key in self.folded_by[record]:
                self.store[key] = self.store.get(key, frozenset()) | {record}
            self.seen.add(record)
            self.derived.setdefault(record, []).append(OTHER)
        self.group[tp] = start + count
        if count and tp in self.known:
            self.foreign.add(tp)

    def _assign(self, data: st.DataObject, positions: dict[TopicPartition, int]) -> None:
        """``ledger.assigned``; stale partitions handled as ConsumerActor.resume and
        PipelineActor._forget do (refused when unwritten: the core restarts)."""
        must = {tp for tp in self.known if tp not in positions or tp in self.foreign}
        may = must | {tp for tp in self.known | self.owned
                      if tp not in positions or positions[tp] != self.my_pos.get(tp)}
        stale = self.ledger.assigned(positions)
        assert must <= stale, f"stale partitions {sorted(must - stale)} not reported"
        assert stale <= may, f"{sorted(stale - may)} reported stale, resumed where committed"
        self.owned = set(positions)
        self.next = dict(positions)
        self.known |= set(positions)
        self.my_pos.update(positions)
        if not stale:
            return
        if data.draw(st.booleans(), label="a commit tick before the pipeline actor forgets"):
            self._commit()
        unwritten = set(self.ledger.unwritten(stale))
        assert self._unwritten_states(stale) <= unwritten
        if unwritten:
            self._restart()
            return
        self._settle(data, self.sends)  # PipelineActor._flush: every checkpoint written
        self._take(force=True)
        while self.pending:
            self._write_oldest()
        assert self._forget(stale, drop_all=True)
        for tp in stale & set(positions):
            self.my_pos[tp] = positions[tp]

    # -- rules -------------------------------------------------------------

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        owned = data.draw(st.sets(st.sampled_from(PARTITIONS), min_size=1))
        self._assign(data, {tp: 0 for tp in sorted(owned)})

    @precondition(lambda self: bool(self.owned))
    @rule(data=st.data())
    def process(self, data: st.DataObject) -> None:
        """The pipeline actor folds a batch of one partition and hands its outputs to the
        producer (one send, numbered by the ledger)."""
        tp = data.draw(st.sampled_from(sorted(self.owned)))
        start = self.next[tp]
        end = start + data.draw(st.integers(1, 3))
        outputs: list[Rec] = []
        for record in [(tp, x) for x in range(start, end)]:
            self._first_sight(data, record)
            fresh = False
            for key in sorted(self.folded_by[record]):
                state = self._load(key)
                if record not in state:
                    state.add(record)
                    self.dirty.add(key)
                    fresh = True
            self.seen.add(record)
            if fresh and self.emits[record]:
                outputs.append(record)
        number = self.ledger.processed({tp: end}, sent=bool(outputs))
        self.next[tp] = end
        self.processed_to[tp] = max(self.processed_to.get(tp, -1), end)
        self.known.add(tp)
        if outputs:
            self.sends += 1
            self.send_records[self.sends] = frozenset(outputs)
            for record in outputs:
                self.derived.setdefault(record, []).append((self.epoch, self.sends))
        assert number == self.sends

    @rule(force=st.booleans())
    def checkpoint(self, force: bool) -> None:
        self._take(force)

    @precondition(lambda self: self.sends > 0)
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        self._settle(data, data.draw(st.integers(0, self.sends)))

    @precondition(lambda self: bool(self.outbox))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        count = self.outbox.pop(data.draw(st.integers(0, len(self.outbox) - 1)))
        self.ledger.outboxed(-count)

    @precondition(lambda self: bool(self.pending))
    @rule()
    def write(self) -> None:
        """Persistence: the oldest checkpoint, if the ledger says it may be written."""
        checkpoint = self.pending[0][0]
        may = checkpoint.sends <= self.settled
        assert self.ledger.writable(checkpoint) == may
        if may:
            self._write_oldest()

    @precondition(lambda self: bool(self.written_cps) or any(
        i > 0 or cp.sends > self.settled for i, (cp, _) in enumerate(self.pending)))
    @rule(data=st.data())
    def write_refused(self, data: st.DataObject) -> None:
        """A checkpoint not the oldest unwritten, or with unsettled sends, or written."""
        refused = [cp for i, (cp, _) in enumerate(self.pending) if i > 0 or cp.sends > self.settled]
        checkpoint = data.draw(st.sampled_from(refused + self.written_cps[-2:]))
        assert not self.ledger.writable(checkpoint)
        before = _fingerprint(self.ledger)
        with pytest.raises(LedgerError):
            self.ledger.written(checkpoint)
        assert _fingerprint(self.ledger) == before

    @rule()
    def commit(self) -> None:
        self._commit()

    @precondition(lambda self: bool(self._unwritten_states(self.owned)))
    @rule(data=st.data())
    def forget_unwritten(self, data: st.DataObject) -> None:
        unwritten = sorted(self._unwritten_states(self.owned))
        parts = {data.draw(st.sampled_from(unwritten))}
        parts |= data.draw(st.sets(st.sampled_from(sorted(self.owned))))
        assert self._unwritten_states(parts) <= set(self.ledger.unwritten(parts))
        before = _fingerprint(self.ledger)
        with pytest.raises(LedgerError):
            self.ledger.forget(parts)
        assert _fingerprint(self.ledger) == before

    @rule(data=st.data())
    def membership(self, data: st.DataObject) -> None:
        """The group or the worker changes (one rule, so that batches, checkpoints,
        sends and writes interleave between these more often than not)."""
        events = ["stream_recreated", "crash", "drain"]
        if self.owned:
            events.append("revoke")
        if len(self.owned) < len(PARTITIONS):
            events.append("assign")
        if any(cp.sends > self.settled for cp, _ in self.pending) and self._written_partitions():
            events.append("revoke_written")
        event = data.draw(st.sampled_from(events))
        if event == "stream_recreated":
            # The consumer was away (no revoke): another member may have taken partitions,
            # processed and committed them; the new stream gets some assignment.
            for tp in PARTITIONS:
                self._other_member(data, tp, data.draw(st.integers(0, 3)))
            owned = data.draw(st.sets(st.sampled_from(PARTITIONS)))
            self._assign(data, {tp: self.group[tp] for tp in sorted(owned)})
        elif event == "crash":
            self._restart()
        elif event == "drain":
            self._drain(data)
        elif event == "revoke":
            parts = data.draw(st.sets(st.sampled_from(sorted(self.owned)), min_size=1))
            flush = data.draw(st.booleans(), label="the producer settles everything first")
            self._revoke(data, parts, flush)
        elif event == "assign":
            # More partitions; another member may have processed them meanwhile.
            free = sorted(set(PARTITIONS) - self.owned)
            added = data.draw(st.sets(st.sampled_from(free), min_size=1))
            for tp in sorted(added):
                self._other_member(data, tp, data.draw(st.integers(0, 3)))
            self._assign(data, {tp: self.group[tp] for tp in sorted(self.owned | added)})
        else:
            # Partitions whose records are all written, while a later checkpoint waits
            # for its sends: forget must work, and what it drops must stay dropped.
            written = sorted(self._written_partitions())
            self._revoke(data, data.draw(st.sets(st.sampled_from(written), min_size=1)), False)

    def _written_partitions(self) -> set[TopicPartition]:
        return {tp for tp in self.owned if tp in self.processed_to
                and not self.ledger.unwritten([tp]) and not self._unwritten_states({tp})}

    def _revoke(self, data: st.DataObject, parts: set[TopicPartition], flush: bool) -> None:
        """A final checkpoint, what may be written, a commit, then forget (or a restart)."""
        if flush:
            self._settle(data, self.sends)
        self._take(force=True)
        while self.pending and self.ledger.writable(self.pending[0][0]):
            self._write_oldest()
        self._commit()
        forgotten = self._forget(parts, drop_all=flush)
        assert forgotten or not flush, "forget refused after a full flush"
        self.owned -= parts
        for tp in parts:
            del self.next[tp]
        if not forgotten:
            self._restart()

    def _drain(self, data: st.DataObject) -> None:
        """A graceful stop (worker.drain): flush; once the outbox is delivered too, a
        commit covers everything processed."""
        self._settle(data, self.sends)
        for count in self.outbox:
            self.ledger.outboxed(-count)
        self.outbox.clear()
        self._take(force=True)
        while self.pending:
            self._write_oldest()
        self._commit()
        for tp in self.owned:
            assert self.group[tp] == max(self.processed_to.get(tp, 0), self.next[tp]), (
                f"{tp} processed to {self.processed_to.get(tp)} is committed at "
                f"{self.group[tp]} after a drain")

    # -- invariants ----------------------------------------------------------

    @invariant()
    def committable_lists_only_owned_partitions_never_behind_the_group(self) -> None:
        for tp, offset in self.ledger.committable().items():
            assert tp in self.owned, f"committable lists {tp}, not owned"
            assert offset >= self.group[tp], (
                f"committable {tp} at {offset} is behind the group's {self.group[tp]}")

    @invariant()
    def whatever_was_committable_stays_durable(self) -> None:
        for tp, offset in self.ever_committable.items():
            self._assert_durable(tp, offset)

    @invariant()
    def ledger_agrees_with_the_model(self) -> None:
        assert self.ledger.processed_offsets() == self.processed_to
        assert self.ledger.outbox_count == sum(self.outbox)


LedgerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, report_multiple_bugs=False)
TestLedgerMachine = LedgerMachine.TestCase


# -- fencing ------------------------------------------------------------------


def test_a_checkpoint_depends_on_the_partitions_with_unwritten_records() -> None:
    ledger = Ledger()
    ledger.assigned({A: 0, B: 0})
    ledger.processed({A: 3, B: 5}, sent=False)
    first = ledger.take(dirty=True)
    assert first is not None and first.depends == {A, B}
    ledger.settled(0)
    ledger.written(first)
    ledger.processed({B: 7}, sent=False)  # only B has new records
    second = ledger.take(dirty=True)
    assert second is not None and second.depends == {B}
    # Forgetting needs everything written, so a forgotten partition is never depended on.
    ledger.written(second)
    ledger.forget({A})
    third = ledger.take(dirty=False, force=True)
    assert third is not None and third.depends == frozenset()


def test_a_moved_partition_is_stale_even_where_the_group_resumes_it_unchanged() -> None:
    ledger = Ledger()
    ledger.assigned({A: 0, B: 0})
    ledger.processed({A: 4, B: 4}, sent=False)
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None
    ledger.written(checkpoint)
    ledger.committed({A: 4, B: 4})
    # Another member held A in between and wrote states, but committed nothing: only
    # its epoch tells.
    assert ledger.assigned({A: 4, B: 4}, moved={A}) == {A}
    assert ledger.committable() == {}
