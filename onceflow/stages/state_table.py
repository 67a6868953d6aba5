"""The cached states of one aggregate (``StateTable``): dirty, unwritten, evictable.

Kept apart from ``state`` (one state and its encoding), which everything on
the record path imports, down to the formats: the table names its
``Aggregate``, so it sits above ``pipeline`` and ``state`` stays below it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from onceflow.stages.pipeline import Aggregate
from onceflow.stages.state import MAX_STATE_BYTES, AggregateState, encode_state


class StateTable:
    """The cached states of one aggregate: which changed, which wait for the store, and
    which may go.

    A bounded cache (``max_states``) evicts least-recently-changed states, but only
    *written* ones: a state folded since its last snapshot (``dirty``), or taken into a
    snapshot the store has not written yet (``unwritten``), is the only copy of its folds
    and watermarks, and reloading the store's older copy would lose them. An evicted
    state therefore reloads exactly what was written, watermarks included, and replays
    are discarded as before. A cache full of such states exceeds the limit until a
    snapshot is written. Recency is kept per snapshot, not per record (the hot path stays
    untouched): a snapshot moves the keys it takes to the recent end.
    """

    def __init__(self, spec: Aggregate, max_states: int | None = None,
                 max_bytes: int = MAX_STATE_BYTES):
        self.spec = spec
        self.max_states = max_states
        self.max_bytes = max_bytes  # the most bytes a value of it may encode to (guards)
        self.states: OrderedDict[str, AggregateState] = OrderedDict()  # least recent first
        self.dirty: set[str] = set()
        self.unwritten: dict[str, int] = {}  # key -> the snapshot holding its last change
        self.closed: dict[tuple[str, int], Any] = {}  # windows closed since the last snapshot
        self.encoded_bytes = 0  # the cached states' sizes as last loaded or encoded
        self.evictions = 0

    def holds(self, keys: list[Any]) -> bool:
        """Whether every key is a string whose state is cached: the fused paths fold only
        then (the runner checks, loads and applies anything else)."""
        states = self.states
        return all(type(key) is str and key in states for key in keys)

    def install(self, key: str, state: AggregateState) -> None:
        """Cache a state just loaded (or new), as the most recent."""
        old = self.states.get(key)
        if old is not None:
            self.encoded_bytes -= old.size
        self.states[key] = state
        self.encoded_bytes += state.size

    def take_dirty(self, snapshot: int) -> dict[str, bytes]:
        """Encode the changed states for ``snapshot``: later folds cannot change what gets
        written. They stay pinned in the cache until ``written(snapshot)``."""
        taken = {}
        states, unwritten = self.states, self.unwritten
        for key in self.dirty:
            state = states[key]
            data = taken[key] = encode_state(state)
            self.encoded_bytes += len(data) - state.size
            state.size = len(data)
            states.move_to_end(key)
            unwritten[key] = snapshot
        self.dirty = set()
        return taken

    def written(self, snapshot: int) -> None:
        """Every snapshot up to ``snapshot`` is in the store: its states may be evicted."""
        if self.unwritten:
            self.unwritten = {key: n for key, n in self.unwritten.items() if n > snapshot}

    def evict(self) -> int:
        """Drop the least recent written states beyond ``max_states``; answers how many.

        A pinned state met on the way moves to the recent end (it changed since the
        last written snapshot, so it is recent), so each call walks past it once.
        """
        limit = self.max_states
        states = self.states
        if limit is None or len(states) <= limit:
            return 0
        dirty, unwritten = self.dirty, self.unwritten
        evicted = 0
        for _ in range(len(states)):
            if len(states) <= limit:
                break
            key, state = states.popitem(last=False)
            if key in dirty or key in unwritten:
                states[key] = state
                continue
            self.encoded_bytes -= state.size
            evicted += 1
        self.evictions += evicted
        return evicted

    def clear(self) -> None:
        """Drop every state (after a rebalance); refuses while one is not written."""
        if self.dirty or self.unwritten:
            raise RuntimeError(f"forget() with unpersisted states in {self.spec.id!r}")
        self.states.clear()
        self.encoded_bytes = 0

    def take_closed(self) -> dict[tuple[str, int], Any]:
        """Closed windows (key, start) -> final value, to be written before the states."""
        taken, self.closed = self.closed, {}
        return taken
