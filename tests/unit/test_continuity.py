"""Offset continuity: dense batches, a hole that fills on re-fetch, a hole that stays."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.kafka.continuity import Continuity, PartitionRewound, Verdict

TP = ("t", 0)


@dataclass(frozen=True)
class Rec:
    offset: int


def recs(*offsets: int) -> list[Rec]:
    return [Rec(o) for o in offsets]


def test_dense_batches_are_delivered_whole_and_advance_the_expected_offset() -> None:
    c = Continuity(refetches=3)
    c.expect(TP, 10)
    assert c.check(TP, recs(10, 11, 12)) == Verdict(3)
    assert c.check(TP, recs(13)) == Verdict(1)
    assert c.expected(TP) == 14


def test_a_partition_never_announced_is_tracked_from_its_first_record() -> None:
    c = Continuity(refetches=3)
    assert c.check(TP, recs(7, 8)) == Verdict(2)
    assert c.check(TP, recs(10)) == Verdict(0, refetch_from=9)


def test_a_hole_at_the_assigned_position_is_refetched() -> None:
    c = Continuity(refetches=3)
    c.expect(TP, 0)
    assert c.check(TP, recs(10, 11)) == Verdict(0, refetch_from=0)
    assert c.expected(TP) == 0


def test_a_hole_inside_a_fetch_delivers_what_is_before_it_then_fills_on_refetch() -> None:
    c = Continuity(refetches=3)
    c.expect(TP, 0)
    assert c.check(TP, recs(0, 1, 2, 5, 6)) == Verdict(3, refetch_from=3)
    assert c.check(TP, recs(5, 6)) == Verdict(0, refetch_from=3)  # still missing
    assert c.check(TP, recs(3, 4, 5, 6)) == Verdict(4)  # written meanwhile
    assert c.expected(TP) == 7


def test_a_hole_that_persists_is_accepted_after_the_bound_and_reported_once() -> None:
    c = Continuity(refetches=2)
    c.expect(TP, 100)
    assert c.check(TP, recs(100, 103)) == Verdict(1, refetch_from=101)
    assert c.check(TP, recs(103)) == Verdict(0, refetch_from=101)
    assert c.check(TP, recs(103, 104)) == Verdict(2, accepted=(101, 102))
    assert c.check(TP, recs(105)) == Verdict(1)


def test_after_an_accepted_hole_the_next_hole_gets_its_own_refetches() -> None:
    c = Continuity(refetches=1)
    c.expect(TP, 0)
    assert c.check(TP, recs(2)) == Verdict(0, refetch_from=0)
    assert c.check(TP, recs(2, 3, 6)) == Verdict(2, refetch_from=4, accepted=(0, 1))
    assert c.check(TP, recs(6)) == Verdict(1, accepted=(4, 5))


def test_a_filled_hole_resets_the_refetch_budget() -> None:
    c = Continuity(refetches=1)
    c.expect(TP, 0)
    assert c.check(TP, recs(1)) == Verdict(0, refetch_from=0)
    assert c.check(TP, recs(0, 1)) == Verdict(2)
    assert c.check(TP, recs(3)) == Verdict(0, refetch_from=2)


def test_records_below_the_expected_offset_are_delivered_and_reanchor() -> None:
    c = Continuity(refetches=1)
    c.expect(TP, 10)
    assert c.check(TP, recs(10, 11, 12, 13)) == Verdict(4)
    assert c.check(TP, recs(11, 12)) == Verdict(2)  # served again: the watermarks discard it
    assert c.expected(TP) == 13


def test_records_below_the_assigned_position_mean_the_log_restarted() -> None:
    c = Continuity(refetches=1)
    c.expect(TP, 10)
    assert c.check(TP, recs(10, 11)) == Verdict(2)
    with pytest.raises(PartitionRewound) as raised:
        c.check(TP, recs(0, 1, 2))  # the client reset to the start of a re-created topic
    assert (raised.value.tp, raised.value.committed, raised.value.found) == (TP, 10, 0)
    assert "t[0] served offset 0, below offset 10" in str(raised.value)
    c.forget([TP])  # a new assignment learns a new position
    c.expect(TP, 0)
    assert c.check(TP, recs(0, 1)) == Verdict(2)


def test_partitions_are_independent_and_forget_drops_the_tracking() -> None:
    c = Continuity(refetches=1)
    other = ("t", 1)
    c.expect(TP, 0)
    c.expect(other, 50)
    assert c.check(other, recs(50)) == Verdict(1)
    assert c.check(TP, recs(1)) == Verdict(0, refetch_from=0)
    c.forget([TP])
    assert c.expected(TP) is None
    assert c.expected(other) == 51


def test_zero_refetches_accepts_a_hole_on_sight_and_negative_is_refused() -> None:
    c = Continuity(refetches=0)
    c.expect(TP, 0)
    assert c.check(TP, recs(0, 3, 4)) == Verdict(3, accepted=(1, 2))
    with pytest.raises(ValueError):
        Continuity(refetches=-1)


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 60),
    cuts=st.lists(st.integers(1, 59), max_size=8),
    holes=st.lists(st.tuples(st.integers(0, 59), st.integers(1, 5), st.integers(0, 4)),
                   max_size=4),
    limit=st.integers(1, 3),
    start=st.integers(0, 3),
)
def test_simulated_tail_delivers_every_record_once_in_order(
    size: int, cuts: list[int], holes: list[tuple[int, int, int]], limit: int, start: int,
) -> None:
    """A log of ``size`` records read from ``start``: hole (first, length, fetches) hides
    its records from that many fetches that reach it, as a broker that has reserved
    them but not yet written them. Holes shorter-lived than the bound are never
    skipped; longer ones are accepted, each reported once, and nothing else is lost."""
    hidden = {}
    for first, length, fetches in holes:
        for offset in range(first, min(first + length, size)):
            hidden[offset] = max(hidden.get(offset, 0), fetches)
    c = Continuity(refetches=limit)
    c.expect(TP, start)
    position, delivered, accepted = start, [], []
    for _ in range(10 * size + 100):
        if position >= size:
            break
        end = min([cut for cut in cuts if cut > position] + [size])  # one fetch's reach
        fetched = [o for o in range(position, end) if hidden.get(o, 0) == 0]
        for o in range(position, end):
            hidden[o] = max(0, hidden.get(o, 0) - 1)
        if not fetched:
            continue  # an empty answer leaves the position where it was
        verdict = c.check(TP, recs(*fetched))
        delivered += fetched[:verdict.deliver]
        if verdict.accepted:
            accepted.append(verdict.accepted)
        position = verdict.refetch_from if verdict.refetch_from is not None else fetched[-1] + 1
    lost = [o for o in range(start, size) if o not in delivered]
    assert delivered == sorted(set(delivered))
    assert lost == [o for first, last in accepted for o in range(first, last + 1)]
    assert all(hidden_for > limit for hidden_for in
               (max(f for h0, n, f in holes if h0 <= o < h0 + n) for o in lost))


def test_a_high_watermark_below_the_expected_offset_stops_after_the_grace() -> None:
    c = Continuity(refetches=1, rewind_grace=5.0)
    c.expect(TP, 400)
    c.ends_at(TP, 50, now=100.0)  # a leader's watermark may lag a moment
    c.ends_at(TP, 50, now=104.9)
    c.ends_at(TP, 400, now=105.0)  # it caught up: the grace starts over
    c.ends_at(TP, 50, now=106.0)
    with pytest.raises(PartitionRewound, match=r"t\[0\] ends at offset 50, below offset 400"):
        c.ends_at(TP, 50, now=111.0)
    c.ends_at(("t", 1), 0, now=200.0)  # a partition not tracked is never judged
