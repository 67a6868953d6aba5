"""A non-windowed stage read from the landing zone: each key's row of highest progress."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from onceflow.analytics.follow import follow_stages
from onceflow.analytics.history import states_over_time
from onceflow.analytics.landing import LandingZone
from onceflow.analytics.readers import landing_states
from onceflow.stages.state import AggregateState, encode_state


def state(count: int, *offsets: int) -> bytes:
    return encode_state(AggregateState({"n": count},
                                       {("in", p): (o,) for p, o in enumerate(offsets)}))


def test_the_latest_row_of_each_key_is_the_one_of_highest_progress(
        spark: Any, tmp_path: Path) -> None:
    zone = LandingZone(tmp_path, "p", plain=["counts"])
    # Written out of order (a replay's file after a later one): progress decides, not time.
    zone.write_states("counts", {"a": state(5, 10, 20), "b": state(1, 3)}, {})
    zone.write_states("counts", {"a": state(2, 4, 6)}, {})
    time.sleep(0.01)
    zone.write_states("counts", {"b": state(4, 9), "c": state(7, 1, 1)}, {})
    rows = landing_states(spark, str(tmp_path), ["counts"]).collect()
    assert sorted((r["stage"], r["key"], r["value"], r["closed"]) for r in rows) == [
        ("counts", "a", '{"n":5}', False), ("counts", "b", '{"n":4}', False),
        ("counts", "c", '{"n":7}', False)]


def test_follow_counts_any_stage_windowed_once_and_plain_by_latest_state(
        spark: Any, tmp_path: Path) -> None:
    zone = LandingZone(tmp_path / "landing", "p", plain=["totals"])
    zone.write_states("totals", {
        "a": encode_state(AggregateState({"amount": 10, "currency": "EUR", "n": 2},
                                         {("in", 0): (3,)})),
        "b": encode_state(AggregateState({"amount": 2.5, "tags": {"x": 1}}, {("in", 1): (4,)})),
    }, {})
    windows = {("a", 0): b"7", ("b", 0): b"5", ("a", 60_000): b"1"}
    first = zone.write("per_minute", windows, {})
    assert first is not None
    first.with_name("copy-" + first.name).write_bytes(first.read_bytes())  # a replayed copy
    updates: list[dict[str, Any]] = []
    checkpoint = tmp_path / "checkpoint"

    def follow() -> dict[str, Any]:
        follow_stages(spark, tmp_path / "landing", ["per_minute"], ["totals", "absent"],
                      checkpoint, lambda _, c: updates.append(c), once=True)
        return updates[-1]

    assert follow() == {
        "per_minute": {"rows": 3, "keys_approx": 2, "sums": {"value": 13}},
        "totals": {"rows": 2, "keys_approx": 2, "sums": {"amount": 12.5, "n": 2}},
    }
    # A later state of "a" replaces its earlier one; new windows add to the stream's sums.
    zone.write_states("totals", {"a": encode_state(AggregateState(
        {"amount": 40, "n": 5}, {("in", 0): (9,)}))}, {})
    zone.write("per_minute", {("c", 0): b"4"}, {})
    assert follow() == {
        "per_minute": {"rows": 4, "keys_approx": 3, "sums": {"value": 17}},
        "totals": {"rows": 2, "keys_approx": 2, "sums": {"amount": 42.5, "n": 5}},
    }


def test_a_plain_stage_over_time_from_its_landed_states(spark: Any, tmp_path: Path) -> None:
    zone = LandingZone(tmp_path, "p", plain=["totals"])
    zone.write_states("totals", {"a": state(3, 5), "b": state(1, 2)}, {})
    # The next two flushes land in the following bucket (1 s here: the history spans about
    # one), early in it: two flushes straddling a bucket's end would make a third bucket.
    time.sleep(1 - time.time() % 1 + 0.02)
    zone.write_states("totals", {"a": state(10, 9), "c": state(4, 1, 1)}, {})
    zone.write_states("totals", {"a": state(3, 5)}, {})  # a replay's older state, written late
    rows = states_over_time(spark, tmp_path, "totals", ["n"])
    assert [(r["keys"], r["field"], r["total"]) for r in rows] == [(2, "n", 4.0), (3, "n", 15.0)]
    assert rows[0]["window_end"] == rows[1]["window_start"] or (
        rows[0]["window_end"] < rows[1]["window_start"])
    assert states_over_time(spark, tmp_path, "absent", ["n"]) == []
