"""Tumbling event-time windows with allowed lateness, as a fold over a key's state.

A windowed aggregate's state is ``{"open": {start_ms: value}, "max_ts": ms}``:
the windows still open and the highest event time the key has seen. A
window [start, start + size) closes once ``max_ts >= end + allowed_lateness``;
its final value leaves the state and becomes a history row
``(stage, key, start)``. An event whose window has already closed is late:
it is not folded, but counted and routed to the late-events topic.

Event time is tracked per key, so the decision for each event depends only
on that key's earlier events: replays decide the same way, and the ground
truth can be recomputed from the input alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping windows of ``size_ms``; ``event_time_ms`` reads a value's time."""

    size_ms: int
    event_time_ms: Callable[[Any], int]
    allowed_lateness_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.allowed_lateness_ms < 0:
            raise ValueError("window size must be > 0 and allowed lateness >= 0")

    def start_of(self, ts: int) -> int:
        return ts - ts % self.size_ms

    def closes_at(self, start: int) -> int:
        """The event time at which the window starting at ``start`` closes."""
        return start + self.size_ms + self.allowed_lateness_ms


def empty_windows() -> dict[str, Any]:
    return {"open": {}, "max_ts": None}


class WindowStep(NamedTuple):
    """What folding one value did: the new state, windows it closed, or that it was late.

    A NamedTuple: one is made per folded value, and a frozen dataclass costs
    several times as much to build.
    """

    state: dict[str, Any]
    closed: list[tuple[int, Any]]
    late_by_ms: int | None = None  # set when the value was late (and not folded)


def fold_windowed(
    window: Tumbling,
    init: Callable[[], Any],
    fold: Callable[[Any, Any], Any],
    state: dict[str, Any],
    value: Any,
) -> WindowStep:
    """Fold ``value`` into its window; never mutates ``state`` (units may roll back).

    Every open window closes after ``max_ts`` (the state holds no window due
    to close), so windows are only scanned when ``max_ts`` rises.
    """
    ts = int(window.event_time_ms(value))
    start = ts - ts % window.size_ms
    closes_at = start + window.size_ms + window.allowed_lateness_ms
    max_ts = state["max_ts"]
    if max_ts is not None and closes_at <= max_ts:
        return WindowStep(state, [], max_ts - closes_at)
    opened: dict[str, Any] = dict(state["open"])
    slot = str(start)  # JSON object keys are strings
    opened[slot] = fold(opened[slot] if slot in opened else init(), value)
    if max_ts is not None and ts <= max_ts:
        return WindowStep({"open": opened, "max_ts": max_ts}, [])
    max_ts = ts
    last_start = max_ts - window.size_ms - window.allowed_lateness_ms  # closes_at <= max_ts
    closed = [(int(s), v) for s, v in opened.items() if int(s) <= last_start]
    for s, _ in closed:
        del opened[str(s)]
    closed.sort()
    return WindowStep({"open": opened, "max_ts": max_ts}, closed)
