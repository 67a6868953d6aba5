"""Tumbling event-time windows: assignment, closing into history, lateness."""

from __future__ import annotations

import json
from typing import Any

from test_runner import Rec, envelope

from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import decode_state, encode_state

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


def run(pipeline: Pipeline, batches: list[list[dict[str, Any]]]) -> tuple[PipelineRunner, list]:
    runner = PipelineRunner(pipeline, lambda spec, keys: {}, "dlq", "late")
    outcomes, offset = [], 0
    for batch in batches:
        records = []
        for doc in batch:
            records.append(Rec("in", 0, offset, envelope(doc)))
            offset += 1
        outcomes.append(runner.process(records))
    return runner, outcomes


def test_events_fold_into_their_minute_and_windows_close_into_history() -> None:
    runner, _ = run(windowed(), [[
        {"k": "a", "ts": [5_000, 30_000]},       # minute 0
        {"k": "a", "ts": [61_000]},              # minute 1: closes minute 0
        {"k": "a", "ts": [62_000, 130_000]},     # minute 2 arrives: closes minute 1
    ]])
    table = runner.tables[0]
    assert table.take_closed() == {("a", 0): 2, ("a", MINUTE): 2}
    assert table.states["a"].value == {"open": {str(2 * MINUTE): 1}, "max_ts": 130_000}


def test_allowed_lateness_keeps_a_window_open_then_late_events_are_routed() -> None:
    runner, outcomes = run(windowed(lateness_ms=10_000), [
        [{"k": "a", "ts": [50_000]}, {"k": "a", "ts": [65_000]}],  # minute 0 still open
        [{"k": "a", "ts": [59_000]}],                               # in time (lateness)
        [{"k": "a", "ts": [71_000]}],                               # closes minute 0
        [{"k": "a", "ts": [1_000, 72_000]}],                        # 1_000 is late
    ])
    table = runner.tables[0]
    assert table.take_closed() == {("a", 0): 2}
    assert table.states["a"].value["open"] == {str(MINUTE): 3}
    last = outcomes[-1]
    assert last.late == {"per_minute": 1} and last.folded == {"per_minute": 1}
    (late,) = last.outputs
    headers = dict(late.headers)
    assert late.topic == "late" and late.key == b"a"
    assert headers["onceflow.reason"] == b"late for stage 'per_minute' by 1000 ms"
    assert headers["onceflow.position"] == b"4.0"


def test_a_late_event_replayed_is_a_duplicate_not_late_again() -> None:
    runner = PipelineRunner(windowed(), lambda spec, keys: {}, "dlq", "late")
    runner.process([Rec("in", 0, 0, envelope({"k": "a", "ts": [200_000]}))])
    late = Rec("in", 0, 1, envelope({"k": "a", "ts": [1_000]}))
    assert runner.process([late]).late == {"per_minute": 1}
    again = runner.process([late])
    assert again.late == {} and again.duplicates == {"per_minute": 1} and again.outputs == []


def test_windowed_state_survives_encoding() -> None:
    runner, _ = run(windowed(), [[{"k": "a", "ts": [5_000, 61_000]}]])
    state = runner.tables[0].states["a"]
    back = decode_state(encode_state(state))
    assert back.value == state.value and back.watermarks == state.watermarks


def test_tumbling_rejects_nonsense() -> None:
    import pytest

    with pytest.raises(ValueError):
        Tumbling(0, event_time_ms=int)
