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

from typing import Any, NamedTuple

from onceflow.stages.declarations import Tumbling as Tumbling  # declared by users


def empty_windows() -> dict[str, Any]:
    return {"open": {}, "max_ts": None}


class WindowStep(NamedTuple):
    """What closing a key's due windows did (``close_due``): the new state, the windows
    closed by start."""

    state: dict[str, Any]
    closed: list[tuple[int, Any]]


def closed_to_of(state: Any) -> int | None:
    """A windowed state's ``max_ts``; TypeError for one that is no int (no onceflow step
    wrote it: a record meeting it is dead-lettered with this reason)."""
    closed_to = state["max_ts"]
    if closed_to is not None and type(closed_to) is not int:
        raise TypeError(f"windowed state's max_ts {closed_to!r} is not an int")
    return closed_to


def close_due(window: Tumbling, state: dict[str, Any], watermark: int | None
              ) -> WindowStep:
    """Close the windows the stage's ``watermark`` has passed; the state then records it
    (the sweep's: ``fold_rules.fold_window`` does the same for a key a record meets).

    Answers the state unchanged (same object) when nothing is due.
    """
    closed_to = state["max_ts"]
    if watermark is None or (closed_to is not None and watermark <= closed_to):
        return WindowStep(state, [])
    last_start = watermark - window.size_ms - window.allowed_lateness_ms  # closes_at <= wm
    opened, closed = split(state["open"], last_start)
    return WindowStep({"open": opened, "max_ts": watermark}, closed)


def split(opened: Any, last_start: int) -> tuple[Any, list[tuple[int, Any]]]:
    """The windows that stay open (``opened`` itself if all do: states are never mutated,
    so sharing is safe) and those starting at or before ``last_start``, which close,
    by start."""
    due = [s for s in opened if int(s) <= last_start]
    if not due:
        return opened, []
    return ({s: v for s, v in opened.items() if int(s) > last_start},
            sorted((int(s), opened[s]) for s in due))


def earliest_start(opened: Any) -> int | None:
    """The earliest open window's start; None without one."""
    first: int | None = None
    for slot in opened:
        start = int(slot)
        if first is None or start < first:
            first = start
    return first
