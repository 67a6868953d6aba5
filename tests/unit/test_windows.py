"""Tumbling event-time windows: assignment, closing into history, lateness."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.fold_rules import UNREAD, Staged, WindowStage, fold_window
from onceflow.stages.state import AggregateState, decode_state, encode_state
from onceflow.stages.state_table import StateTable
from onceflow.stages.window_clock import WindowClock
from onceflow.stages.windows import empty_windows
from onceflow.testing import Record, TestRun

MINUTE = 60_000


def windowed(lateness_ms: int = 0) -> Pipeline:
    """Records are {"k": key, "ts": [event times]}; count events per key per minute."""
    return (
        Pipeline("w", topics=("in",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: [(r["k"], ts) for ts in r["ts"]])
        .aggregate(
            "per_minute", key=lambda e: e[0], init=lambda: 0, fold=lambda s, e: s + 1,
            window=Tumbling(MINUTE, event_time_ms=lambda e: e[1], allowed_lateness_ms=lateness_ms),
        )
    )


def test_events_fold_into_their_minute_and_windows_close_into_history() -> None:
    run = TestRun(windowed())
    run.feed([
        Record({"k": "a", "ts": [5_000, 30_000]}),       # minute 0
        Record({"k": "a", "ts": [61_000]}),              # minute 1: closes minute 0
        Record({"k": "a", "ts": [62_000, 130_000]}),     # minute 2 arrives: closes minute 1
    ])
    assert run.closed_windows("per_minute") == {("a", 0): 2, ("a", MINUTE): 2}
    assert run.states("per_minute")["a"] == {"open": {str(2 * MINUTE): 1}, "max_ts": 130_000}


def test_allowed_lateness_keeps_a_window_open_then_late_events_are_routed() -> None:
    run = TestRun(windowed(lateness_ms=10_000), late_events_topic="late")
    run.feed([Record({"k": "a", "ts": [50_000]}), Record({"k": "a", "ts": [65_000]})])  # minute 0
    run.feed([Record({"k": "a", "ts": [59_000]})])            # in time (lateness)
    run.feed([Record({"k": "a", "ts": [71_000]})])            # closes minute 0
    before = run.counters.copy()
    run.feed([Record({"k": "a", "ts": [1_000, 72_000]})])     # 1_000 is late
    assert run.closed_windows("per_minute") == {("a", 0): 2}
    assert run.states("per_minute")["a"]["open"] == {str(MINUTE): 3}
    assert run.counters - before == {"records": 1, "per_minute.late": 1, "per_minute.folded": 1}
    (late,) = run.produced
    assert late.topic == "late" and late.key == b"a"
    assert late.headers["onceflow.reason"] == "late for stage 'per_minute' by 1000 ms"
    assert late.headers["onceflow.position"] == "4.0"
    assert late.headers["onceflow.root"] == "in/0"


def test_a_late_event_replayed_is_a_duplicate_not_late_again() -> None:
    run = TestRun(windowed(), late_events_topic="late")
    run.feed([Record({"k": "a", "ts": [200_000]})])
    (late,) = run.feed([Record({"k": "a", "ts": [1_000]})])
    assert run.counters["per_minute.late"] == 1
    run.duplicate(late)
    assert run.counters["per_minute.late"] == 1 and run.counters["per_minute.duplicates"] == 1
    assert len(run.produced) == 1  # the first late output only


def test_windowed_state_survives_encoding() -> None:
    run = TestRun(windowed())
    run.feed([Record({"k": "a", "ts": [5_000, 61_000]})])
    state = run.runner.tables[0].states["a"]
    back = decode_state(encode_state(state))
    assert back.value == state.value and back.watermarks == state.watermarks


def test_tumbling_rejects_nonsense() -> None:
    import pytest

    with pytest.raises(ValueError):
        Tumbling(0, event_time_ms=int)


class Folded(NamedTuple):
    state: dict[str, Any]
    closed: list[tuple[int, Any]]
    late_by_ms: int | None


def fold_windowed(window: Tumbling, init: Any, fold: Any, state: dict[str, Any], value: Any,
                  watermark: int | None = None) -> Folded:
    """One value through the engine's windowed fold (``fold_rules.fold_window``) on a key
    whose stored state is ``state``, as a record meeting it alone would stage it."""
    spec = (Pipeline("w", topics=("in",))
            .aggregate("a", key=str, init=init, fold=fold, window=window).aggregates[0])
    table = StateTable(spec)
    stage = WindowStage(spec.key, table, WindowClock(table))
    stage.fed_from = ("in", 0)
    staged = Staged("k", AggregateState(state), None)
    before = json.dumps(state, sort_keys=True)
    late_by = fold_window(stage, staged, value, int(window.event_time_ms(value)), watermark)
    assert json.dumps(state, sort_keys=True) == before  # the stored state is never mutated
    if staged.opened is UNREAD:
        return Folded(state, [], late_by)
    return Folded({"open": staged.opened, "max_ts": staged.closed_to}, staged.closing or [],
                  late_by)


def reference_fold(window: Tumbling, state: dict[str, Any], ts: int, watermark: int | None
                   ) -> tuple[dict[str, Any], list[tuple[int, int]], int | None]:
    """The windows' rule written plainly: close every window the watermark passed, then
    refuse the event if its window closed, else count it."""
    closed_to = state["max_ts"]
    opened = dict(state["open"])
    closed = []
    if watermark is not None and (closed_to is None or watermark > closed_to):
        closed_to = watermark
        closed = sorted((int(s), v) for s, v in opened.items()
                        if window.closes_at(int(s)) <= closed_to)
        opened = {s: v for s, v in opened.items() if window.closes_at(int(s)) > closed_to}
    start = ts - ts % window.size_ms
    if closed_to is not None and window.closes_at(start) <= closed_to:
        return {"open": opened, "max_ts": closed_to}, closed, closed_to - window.closes_at(start)
    opened[str(start)] = opened.get(str(start), 0) + 1
    return {"open": opened, "max_ts": closed_to}, closed, None


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 50), lateness=st.integers(0, 120),
       events=st.lists(st.tuples(st.integers(0, 2_000), st.integers(-1, 2_000)), max_size=60))
def test_the_fold_decides_like_the_plain_rule(size: int, lateness: int,
                                              events: list[tuple[int, int]]) -> None:
    # Any event order and any watermark sequence (-1: none yet; a lower one than before
    # changes nothing): the engine closes, keeps and refuses what the plain rule does.
    window = Tumbling(size, event_time_ms=lambda ts: ts, allowed_lateness_ms=lateness)
    fast = plain = empty_windows()
    for ts, mark in events:
        watermark = None if mark < 0 else mark
        step = fold_windowed(window, lambda: 0, lambda n, _: n + 1, fast, ts, watermark)
        plain, closed, late_by = reference_fold(window, plain, ts, watermark)
        assert (step.closed, step.late_by_ms) == (closed, late_by)
        fast = step.state
        assert fast == plain


def test_an_old_state_keeps_its_closed_windows_closed() -> None:
    # A state written by the per-key rule ("max_ts": the key's highest event time) loads
    # and means the same: every window closing at or before it is closed.
    window = Tumbling(MINUTE, event_time_ms=lambda ts: ts)
    old = {"open": {str(2 * MINUTE): 4}, "max_ts": 2 * MINUTE + 5}
    step = fold_windowed(window, lambda: 0, lambda n, _: n + 1, old, MINUTE + 1, None)
    assert step.late_by_ms == 5 and step.state == old
    step = fold_windowed(window, lambda: 0, lambda n, _: n + 1, old, 2 * MINUTE + 1, None)
    assert step.state == {"open": {str(2 * MINUTE): 5}, "max_ts": 2 * MINUTE + 5}


@pytest.mark.parametrize("general", [False, True], ids=["fused", "general"])
def test_an_event_time_is_read_through_int_compiled_or_pure(general: bool) -> None:
    # A user's event-time function may answer anything: int() reads it, so a numeric
    # string or a float folds and anything else dead-letters with int()'s error, on the
    # fused path (a cached key, nothing after the windowed aggregate) as on the general
    # one (a republish after it). An int hint on Tumbling.event_time_ms would make compiled
    # code check the answer first: "int object expected; got str".
    pipeline = (
        Pipeline("w", topics=("in",), decode=lambda e: json.loads(e.payload))
        .map("same", lambda r: r)
        .aggregate("per_minute", key=lambda r: r["k"], init=lambda: 0, fold=lambda s, _: s + 1,
                   window=Tumbling(MINUTE, event_time_ms=lambda r: r["t"])))
    if general:
        pipeline = pipeline.republish("out", "out")
    run = TestRun(pipeline)
    run.feed([Record({"k": "a", "t": MINUTE})])  # loads the key's state: cached after
    run.feed([Record({"k": "a", "t": t}) for t in ("61000", 62_000.9, "x", None)])
    assert run.states("per_minute")["a"] == {"open": {str(MINUTE): 3}, "max_ts": 62_000}
    assert [d.headers["onceflow.reason"] for d in run.outputs(run.dead_letter_topic)] == [
        "stage 'per_minute', key 'a': ValueError: invalid literal for int() with base 10: 'x'",
        "stage 'per_minute', key 'a': TypeError: int() argument must be a string, a "
        "bytes-like object or a real number, not 'NoneType'"]
    window = Tumbling(MINUTE, event_time_ms=lambda r: r["t"])
    step = fold_windowed(window, lambda: 0, lambda n, _: n + 1, empty_windows(), {"t": "61000"})
    assert step.state == {"open": {str(MINUTE): 1}, "max_ts": None}
