"""Stored rows set against recomputed ones: one verdict per stage and key (and window).

A plain aggregate has one entry per key: its value. A windowed aggregate has one per
key for its state (the windows still open) and one per closed window (its history
row); a window the store holds both closed and open (a crash between the two writes)
counts as closed, as the readers do (``runtime.states``).

Verdicts: ``equal``; ``drifted`` (stored and recomputed differ); ``missing`` (recomputed,
not stored); ``unexpected`` (stored, not recomputed). A stored state whose watermarks
are past what the replay reached (it folded records beyond the committed offsets: a
worker running, or killed after a persist and before its commit) cannot be decided
from the replay: ``ahead``. With an input partition whose head is no longer retained,
every difference is ``not retained``: the replay lacks records the states may hold;
and a key fed from such a partition is ``not retained`` even when equal (the state may
hold records the replay never saw: equality there would be a guess).
With a merge log (``reconcile.order``) that does not cover every ordered input up to
the committed offsets, every difference is ``order unknown``: the replay may have
interleaved the partitions otherwise than the worker.
A recomputed row the store may have dropped on purpose (``reconcile.expiry``: a state
past ``expire_after``, a history row past ``history-retention``) is ``expired``, with
the rule that allowed it (``Entry.rule``), not ``missing``.
A state that differs where the input shows a gap of ``expire-after`` or more (it may
have expired and started again: ``reconcile.expiry.restart_rule``) is ``maybe
restarted``, with that rule: undecided, not drifted.
A drifted state names the input records the replay folded into it and the store did
not (``unfolded``), as far as the two sets of watermarks tell.
A stored row that is no onceflow state (``decode_state`` refuses it) is ``drifted``,
or ``unexpected`` for a key the replay never met.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from onceflow.reconcile.expiry import root_of_route
from onceflow.stages.lineage import Position, Route
from onceflow.stages.pipeline import Aggregate
from onceflow.stages.state import AggregateState, decode_state

__all__ = ["DIFFERENT", "UNDECIDED", "Entry", "compare_stage", "route_heights", "unfolded"]

DIFFERENT = ("drifted", "missing", "unexpected")
UNDECIDED = ("ahead", "not retained", "order unknown", "maybe restarted")


@dataclass(frozen=True)
class Entry:
    """One compared row: a key's state (``window`` None) or a closed window."""

    stage: str
    key: str
    window: int | None
    verdict: str
    stored: Any = None
    recomputed: Any = None
    rule: str | None = None  # why an expired row may be gone
    records: tuple[str, ...] = ()  # a drifted state: input it lacks, as its watermarks tell

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "key": self.key, "window": self.window,
                "verdict": self.verdict, "stored": self.stored, "recomputed": self.recomputed,
                "rule": self.rule, "records": list(self.records)}


def route_heights(states: Iterable[AggregateState]) -> dict[Route, Position]:
    """The highest position the replay folded per route, over all of a stage's keys."""
    heights: dict[Route, Position] = {}
    for state in states:
        for route, position in state.watermarks.items():
            if position > heights.get(route, ()):
                heights[route] = position
    return heights


def _ahead(state: AggregateState, heights: Mapping[Route, Position],
           inputs: Collection[Route]) -> bool:
    """Whether a stored state folded a position the replay never reached."""
    for route, position in state.watermarks.items():
        height = heights.get(route)
        if height is None:
            if route in inputs:  # an input partition the replay read nothing folded from
                return True
        elif position > height:
            return True
    return False


def compare_stage(spec: Aggregate, stored: Iterable[tuple[str, bytes]],
                  stored_history: Iterable[tuple[str, int, bytes]],
                  recomputed: Mapping[str, AggregateState],
                  recomputed_history: Iterable[tuple[str, int, bytes]],
                  inputs: Collection[Route], keys: Collection[str] = (),
                  retained: bool = True, ordered: bool = True,
                  aged: Callable[[str, int | None], str | None] | None = None,
                  lost: Collection[tuple[str, int]] = (), cut: bool = False,
                  restarted: Mapping[str, str] | None = None) -> Iterator[Entry]:
    """Every entry of one stage; ``keys``: only those keys (empty: all); ``aged``: the
    rule that lets a recomputed row be gone from the store (None: it must be there);
    ``lost``: root partitions whose head is gone (a key fed from one is never called
    equal); ``cut``: the replay stopped before the commits (``--from-offsets``), so a
    window the store closed and the replay did not is ``ahead``; ``restarted``: keys whose
    state may have expired and started again -> why (``reconcile.expiry.restart_rule``)."""
    blind = None if retained and ordered else "not retained" if not retained else "order unknown"

    def wanted(key: str) -> bool:
        return not keys or key in keys

    heights = route_heights(recomputed.values())
    left = {key for key in recomputed if wanted(key)}
    unseen = {key for key, state in recomputed.items() if _fed_from(state, lost)}
    closed: dict[tuple[str, int], Any] = {}
    if spec.window is not None:
        closed = {(key, start): json.loads(value) for key, start, value in stored_history
                  if wanted(key)}
    aheads: set[str] = set()

    def judged(key: str, window: int | None, stored: Any, again: Any, ahead: bool) -> Entry:
        if stored == again and key in unseen:  # equal to a replay that lacks its head
            return Entry(spec.id, key, window, "not retained", stored, again)
        verdict = "equal" if stored == again else "drifted"
        return _entry(spec.id, key, window, verdict, stored, again, ahead, blind)

    for key, data in stored:
        if not wanted(key):
            continue
        try:
            state = decode_state(data)
        except ValueError as error:  # no state onceflow wrote: wrong whatever it should be
            left.discard(key)
            yield Entry(spec.id, key, None, "drifted" if key in recomputed else "unexpected",
                        f"undecodable: {error}", _recomputed(spec, key, recomputed))
            continue
        ahead = _ahead(state, heights, inputs)
        if ahead:
            aheads.add(key)
        if _fed_from(state, lost):
            unseen.add(key)
        mine = recomputed.get(key)
        left.discard(key)
        value = _comparable(spec, key, state.value, closed)
        if mine is None:
            yield _entry(spec.id, key, None, "unexpected", value, None, ahead, blind)
            continue
        again = _comparable(spec, key, mine.value, closed if cut else {})
        entry = judged(key, None, value, again, ahead)
        if entry.verdict == "drifted" and restarted and key in restarted:
            entry = replace(entry, verdict="maybe restarted", rule=restarted[key])
        elif entry.verdict == "drifted":
            entry = replace(entry, records=unfolded(state, mine))
        yield entry

    def missing(key: str, window: int | None, again: Any) -> Entry:
        rule = None if aged is None else aged(key, window)
        if rule is not None:
            return Entry(spec.id, key, window, "expired", None, again, rule)
        return _entry(spec.id, key, window, "missing", None, again, False, blind)

    for key in sorted(left):
        yield missing(key, None, _comparable(spec, key, recomputed[key].value, {}))
    if spec.window is None:
        return
    for key, start, value in recomputed_history:
        if not wanted(key):
            continue
        again = json.loads(value)
        if (key, start) not in closed:
            yield missing(key, start, again)
            continue
        yield judged(key, start, closed.pop((key, start)), again, key in aheads)
    for (key, start), found in sorted(closed.items()):
        yield _entry(spec.id, key, start, "unexpected", found, None, cut or key in aheads, blind)


def unfolded(stored: AggregateState, mine: AggregateState) -> tuple[str, ...]:
    """The input records the replay folded into a key and its stored state did not, as far
    as the watermarks tell: per route, the newest record the replay folded past the
    stored position (certainly the key's), and the offsets between (the key's records
    among them, unknown without a per-key log); or that both folded the same records."""
    found = []
    for route, position in sorted(mine.watermarks.items()):
        have = stored.watermarks.get(route)
        if have is not None and position <= have:
            continue
        topic, partition = root_of_route(route)
        via = "" if route == (topic, partition) else f" (via {route[0]}/{route[1]})"
        newest = f"{topic}/{partition}@{position[0]}{via}"
        if have is None:
            found.append(f"{newest}, and any before it: the store folded none of them")
        elif have[0] == position[0]:
            found.append(f"{newest}: its items past {have[1:]}")
        elif have[0] + 1 < position[0]:
            found.append(f"{newest}, and any of {have[0] + 1}..{position[0] - 1}")
        else:
            found.append(newest)
    if not found and stored.watermarks != mine.watermarks:
        return ()  # the store folded more, on a route the replay did not reach: no name
    return tuple(found) or ("the same records by the watermarks: folded to another value",)


def _fed_from(state: AggregateState, lost: Collection[tuple[str, int]]) -> bool:
    """Whether a state folded a record of a root partition in ``lost``."""
    return bool(lost) and any(root_of_route(route) in lost for route in state.watermarks)


def _recomputed(spec: Aggregate, key: str, recomputed: Mapping[str, AggregateState]) -> Any:
    state = recomputed.get(key)
    return None if state is None else _comparable(spec, key, state.value, {})


def _comparable(spec: Aggregate, key: str, value: Any, closed: Mapping[tuple[str, int], Any]
                ) -> Any:
    """A plain aggregate's value; a windowed one's open windows, less those stored closed."""
    if spec.window is None:
        return value
    return {start: v for start, v in value["open"].items() if (key, int(start)) not in closed}


def _entry(stage: str, key: str, window: int | None, verdict: str, stored: Any,
           recomputed: Any, ahead: bool, blind: str | None) -> Entry:
    """``blind``: what a difference is called when the replay cannot see it all."""
    if verdict != "equal":
        if ahead:
            verdict = "ahead"
        elif blind is not None:
            verdict = blind
    return Entry(stage, key, window, verdict, stored, recomputed)
