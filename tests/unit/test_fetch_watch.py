"""Fetch starvation: records wait, fetches bring none, for seconds of unpaused fetching."""

from __future__ import annotations

import pytest

from onceflow.kafka.fetch_watch import FetchWatch, Starved

TP = ("t", 0)


def empty(watch: FetchWatch, now: float, *, expected: int = 10, highwater: int = 50,
          paused: bool = False) -> Starved | None:
    return watch.observe(TP, now, expected=expected, highwater=highwater, fetched=False,
                         paused=paused)


def test_empty_fetches_while_records_wait_starve_after_the_bound_then_count_again() -> None:
    watch = FetchWatch(after=2.0)
    assert [empty(watch, t) for t in (0.0, 0.5, 1.0, 1.5)] == [None] * 4
    assert empty(watch, 2.0) == Starved(TP, 10, 50, 2.0)
    assert empty(watch, 3.5) is None  # counting again from zero
    assert empty(watch, 4.0) == Starved(TP, 10, 50, 2.0)


def test_records_or_nothing_waiting_is_no_starvation() -> None:
    watch = FetchWatch(after=2.0)
    empty(watch, 0.0)
    empty(watch, 1.9)
    assert watch.observe(TP, 2.0, expected=10, highwater=50, fetched=True, paused=False) is None
    assert empty(watch, 3.9) is None  # starts over after the records
    assert empty(watch, 5.0, expected=50, highwater=50) is None  # at the log end: caught up
    assert empty(watch, 6.0) is None
    assert empty(watch, 7.9) is None
    assert empty(watch, 8.0) is not None


def test_unknown_offsets_never_starve() -> None:
    watch = FetchWatch(after=1.0)
    for t in range(5):
        assert watch.observe(TP, float(t), expected=None, highwater=50, fetched=False,
                             paused=False) is None
        assert watch.observe(TP, float(t), expected=10, highwater=None, fetched=False,
                             paused=False) is None


def test_paused_time_does_not_count() -> None:
    """Backpressure or a re-fetch hold: the partition was not fetched meanwhile."""
    watch = FetchWatch(after=2.0)
    empty(watch, 0.0)
    empty(watch, 1.5)
    assert empty(watch, 60.0, paused=True) is None
    assert empty(watch, 61.0) is None  # resumed: 1.5 s so far
    assert empty(watch, 61.4) is None
    assert empty(watch, 61.5) is not None
    watch.idle()  # all paused until the next observation
    assert empty(watch, 100.0) is None
    assert empty(watch, 101.9) is None
    assert empty(watch, 102.0) is not None


def test_forgotten_partitions_start_over() -> None:
    watch = FetchWatch(after=2.0)
    empty(watch, 0.0)
    empty(watch, 1.9)
    watch.forget([TP])
    assert empty(watch, 2.5) is None
    assert empty(watch, 4.4) is None
    assert empty(watch, 4.5) is not None


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FetchWatch(after=0)
