"""A non-windowed stage read from the landing zone: each key's row of highest progress."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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
