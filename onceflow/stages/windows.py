"""Tumbling event-time windows with allowed lateness, as a fold over a key's state.

A windowed aggregate's state is ``{"open": {start_ms: value}, "max_ts": ms}``:
the windows still open and the event time up to which the key's windows are
closed. A window [start, start + size) closes once the stage's watermark
(``stages.watermark``: the lowest of the highest event times of the root
partitions feeding the stage) reaches ``end + allowed_lateness``; its final
value leaves the state and becomes a history row ``(stage, key, start)``,
and ``max_ts`` becomes that watermark. An event whose window closes at or
before ``max_ts`` is late: it is not folded, but counted and routed to the
late-events topic.

``max_ts`` keeps its name from the earlier rule (the key's own highest event
time, under which every window closing at or before it was closed too), so
states written by it load and mean the same. How a replay, which may meet
another watermark, keeps its late decisions consistent: ``side_outputs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from onceflow.stages.declarations import Tumbling as Tumbling  # declared by users


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
    opened: bool = False  # the value opened a window (the key's open windows changed)


def closed_to_of(state: Any) -> int | None:
    """A windowed state's ``max_ts``; TypeError for one that is no int (no onceflow step
    wrote it: a record meeting it is dead-lettered with this reason)."""
    closed_to = state["max_ts"]
    if closed_to is not None and type(closed_to) is not int:
        raise TypeError(f"windowed state's max_ts {closed_to!r} is not an int")
    return closed_to


def close_due(window: Tumbling, state: dict[str, Any], watermark: int | None
              ) -> WindowStep:
    """Close the windows the stage's ``watermark`` has passed; the state then records it.

    Answers the state unchanged (same object) when nothing is due.
    """
    closed_to = state["max_ts"]
    if watermark is None or (closed_to is not None and watermark <= closed_to):
        return WindowStep(state, [])
    opened, closed = _split(window, state["open"], watermark)
    return WindowStep({"open": opened, "max_ts": watermark}, closed)


def _split(window: Tumbling, opened: dict[str, Any], watermark: int
           ) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    """The windows that stay open (``opened`` itself if all do: states are never mutated,
    so sharing is safe) and those ``watermark`` closes, by start."""
    last_start = watermark - window.size_ms - window.allowed_lateness_ms  # closes_at <= wm
    due = [s for s in opened if int(s) <= last_start]
    if not due:
        return opened, []
    return ({s: v for s, v in opened.items() if int(s) > last_start},
            sorted((int(s), opened[s]) for s in due))


def fold_windowed(
    window: Tumbling,
    init: Callable[[], Any],
    fold: Callable[[Any, Any], Any],
    state: Any,  # a windowed state, or a damaged one that fails here as a fold would
    value: Any,
    watermark: int | None = None,
    ts: int | None = None,  # the value's event time, if the caller read it already
) -> WindowStep:
    """Fold ``value`` into its window; never mutates ``state`` (units may roll back).

    First the key's windows the stage's ``watermark`` has passed close (the
    state may not have been touched since it rose); then a value whose window
    closes at or before what the key has closed up to is late, and keeps the
    state with those closings. (``close_due`` then the fold, in one pass: one
    state built per value.)
    """
    if ts is None:
        ts = int(window.event_time_ms(value))
    start = ts - ts % window.size_ms
    closes_at = start + window.size_ms + window.allowed_lateness_ms
    closed_to, opened = closed_to_of(state), state["open"]
    closed: list[tuple[int, Any]] = []
    rose = watermark is not None and (closed_to is None or watermark > closed_to)
    if rose:
        opened, closed = _split(window, opened, watermark)  # type: ignore[arg-type]
        closed_to = watermark
    if closed_to is not None and closes_at <= closed_to:
        caught_up = {"open": opened, "max_ts": closed_to} if rose else state
        return WindowStep(caught_up, closed, closed_to - closes_at)
    opened = dict(opened)
    slot = str(start)  # JSON object keys are strings
    if slot in opened:
        opened[slot] = fold(opened[slot], value)
        return WindowStep({"open": opened, "max_ts": closed_to}, closed)
    opened[slot] = fold(init(), value)
    return WindowStep({"open": opened, "max_ts": closed_to}, closed, None, True)
