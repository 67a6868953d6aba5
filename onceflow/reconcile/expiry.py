"""Which recomputed rows the store may have dropped on purpose: expired states and history
rows past their retention. Those are "expired", not "missing", with the rule that said so.

The store drops a state's row ``expire_after`` seconds after its last write (an
aggregate's own ``expire_after`` wins over ``onceflow.state.expire-after``; a windowed
state with an open window never expires), and a history row ``history-retention``
seconds after it was written. The input does not record when the worker wrote, only
a lower bound: the worker wrote a row after it applied every record that went into it,
and it cannot apply a record before the record's Kafka timestamp. So a row whose
bound plus its lifetime is still in the future cannot have expired: gone, it is
``missing`` (exit 1). Past it, the row may have expired: ``expired`` (exit 0), with the
bound and the lifetime named.

The bounds: for a state, the timestamp of the newest record folded into it (its
watermarks name the records' root offsets, ``Replay.timestamp``); for a closed window,
the newest record the replay applied before the chunk in which the window closed
(``Replay.closed_after``; none before the first chunk: no bound, the row may be gone).
A timestamp from a producer's clock that runs behind makes a bound too early: such a
row may be called expired though it was lost (the lifetime is still the rule).
A state may also have expired and been started afresh by later records: then it holds
only those. The input tells where that could have happened (``Replay.gaps``: two
records of the key ``expire-after`` or more apart, as far as the replay's chunks
show), not whether it did; a state that differs from the replay and has such a gap is
``maybe restarted`` (``restart_rule``: cannot decide, exit 2), never ``equal``, and
never ``drifted`` on that ground alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from onceflow.runtime.settings import Settings
from onceflow.stages.lineage import Route
from onceflow.stages.pipeline import Aggregate
from onceflow.stages.state import AggregateState
from onceflow.stages.state_table import has_open_window

__all__ = ["Aged", "Lifetimes", "aged", "lifetimes", "restart_rule", "root_of_route"]

#: A recomputed row the store does not hold -> the rule that lets it be gone (None: missing).
Aged = Callable[[str, "int | None"], "str | None"]
#: (topic, partition, offset) -> the record's Kafka timestamp (ms), None: not read.
Stamp = Callable[[str, int, int], "int | None"]


@dataclass(frozen=True)
class Lifetimes:
    """How long the store keeps a stage's rows after their last write (seconds, 0: ever)."""

    states: float
    history: float
    windowed: bool = False


def lifetimes(settings: Settings, spec: Aggregate) -> Lifetimes:
    states = settings.state.expire_after if spec.expire_after is None else spec.expire_after
    history = settings.state.history_retention if spec.window is not None else 0.0
    return Lifetimes(states, history, spec.window is not None)


def root_of_route(route: Route) -> tuple[str, int]:
    """The root partition of a route (``lineage``: a longer path is ``"<root>/<p>>..."``)."""
    topic, partition = route
    if "/" not in topic:
        return topic, partition
    root, _, rest = topic.partition("/")
    return root, int(rest.split(">", 1)[0])


def newest_input(state: AggregateState, stamp: Stamp) -> int | None:
    """The Kafka timestamp (ms) of the newest record folded into ``state`` that was read."""
    found = [stamp(*root_of_route(route), position[0])
             for route, position in state.watermarks.items() if position]
    return max((ms for ms in found if ms is not None), default=None)


def aged(life: Lifetimes, recomputed: Mapping[str, AggregateState], stamp: Stamp,
         closed_after: Mapping[tuple[str, int], int | None], now: float | None = None) -> Aged:
    """The rule for one stage's rows (``closed_after``: (key, window start) -> the bound of
    each recomputed closed window, ms, None: none)."""
    clock = time.time() if now is None else now

    def rule(key: str, window: int | None) -> str | None:
        if window is not None:
            if not life.history:
                return None
            bound = closed_after.get((key, window))
            return _past("history-retention", life.history, bound, clock, "closed")
        state = recomputed.get(key)
        if not life.states or state is None:
            return None
        if life.windowed and has_open_window(state.value):
            return None  # a state with an open window does not expire
        return _past("expire-after", life.states, newest_input(state, stamp), clock,
                     "last folded")

    return rule


def restart_rule(seconds: float, before: int, after: int) -> str:
    """Why a key whose state differs may have expired and started again (ms bounds)."""
    at = [datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
          for ms in (before, after)]
    return (f"expire-after {seconds:g} s <= {(after - before) / 1000:.0f} s between input of "
            f"{at[0]} and of {at[1]}: the state may have expired and started again")


def _past(name: str, seconds: float, bound: int | None, now: float, what: str) -> str | None:
    if bound is None:
        return f"{name} {seconds:g} s, {what} in the first chunk read (no bound on its write)"
    age = now - bound / 1000
    if age < seconds:
        return None
    at = datetime.fromtimestamp(bound / 1000, UTC).isoformat(timespec="seconds")
    return f"{name} {seconds:g} s < {age:.0f} s since input of {at} was {what}"
