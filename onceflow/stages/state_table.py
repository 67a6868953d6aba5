"""The cached states of one aggregate (``StateTable``): dirty, unwritten, evictable, expiring.

Kept apart from ``state`` (one state and its encoding), which everything on
the record path imports, down to the formats: the table names its
``Aggregate``, so it sits above ``pipeline`` and ``state`` stays below it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from onceflow.stages.pipeline import Aggregate
from onceflow.stages.state import MAX_STATE_BYTES, AggregateState, encode_state

#: Seconds the cache lets a state go before its row's expiry: Cassandra counts a TTL from
#: the whole second its write landed in, so a row lapses up to a second early.
STORE_SLACK = 1.0


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

    State expiry (``expire_after`` seconds, 0: never): the store drops a state's row
    that long after its last write (``lasting`` names the rows that must not expire: a
    windowed state with an open window). The table drops its cached copy once as long
    (less ``STORE_SLACK``) has passed since the state was taken into a snapshot, or
    loaded (``expire``), no later than its row expires (written after it was taken), so
    the next record of the key loads what the store holds, or nothing, and starts fresh.
    A state loaded keeps its cached copy up to ``expire_after`` after the load: met
    again in between, it goes on (its row written again), as if it had expired that much
    later. Stamped per snapshot and load, not per record.
    """

    def __init__(self, spec: Aggregate, max_states: int | None = None,
                 max_bytes: int = MAX_STATE_BYTES, expire_after: float = 0.0):
        self.spec = spec
        self.stage_id: str = spec.id  # read on every fold (a native field)
        self.max_states = max_states
        self.max_bytes = max_bytes  # the most bytes a value of it may encode to (guards)
        # the aggregate's own expiry wins over the worker's default
        self.expire_after: float = expire_after if spec.expire_after is None \
            else spec.expire_after
        self.windowed = spec.window is not None
        # key -> when its state was last taken or loaded (``clock``), when it expires
        self.stamps: dict[str, float] = {}
        self.clock: Callable[[], float] = time.monotonic
        self.expired = 0
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
        if self.expire_after:
            self.stamps[key] = self.clock()

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
        if self.expire_after and taken:
            now, stamps = self.clock(), self.stamps
            for key in taken:
                stamps[key] = now
        return taken

    def lasting(self, keys: Iterable[str]) -> frozenset[str]:
        """Of ``keys`` (just taken), those whose rows must not expire: a windowed state
        with an open window (its expiry starts when its last window closed). Empty without
        expiry."""
        if not self.expire_after or not self.windowed:
            return frozenset()
        states = self.states
        return frozenset(key for key in keys if has_open_window(states[key].value))

    def expire(self) -> int:
        """Drop the cached states not taken or loaded for ``expire_after``; answers how many.

        Oldest first (a snapshot moves the keys it takes to the recent end, stamped);
        stops at the first one still fresh. A pinned one (dirty or unwritten: folded since,
        so not expiring, and stamped again when taken) moves to the recent end, as in
        ``evict``; so does a state with an open window, stamped now: it never expires.
        The actor calls it before each batch, so a key whose store row has expired is
        not found cached by its next record.
        """
        ttl = self.expire_after
        states = self.states
        if not ttl or not states:
            return 0
        now = self.clock()
        deadline = now - ttl + STORE_SLACK
        stamps, dirty, unwritten = self.stamps, self.dirty, self.unwritten
        expired = 0
        for _ in range(len(states)):
            key = next(iter(states))
            stamp = stamps.get(key)
            if stamp is None:  # cached by hand (a test, a tool): its time starts now
                stamps[key] = now
                states.move_to_end(key)
                continue
            if stamp > deadline:
                break
            if key in dirty or key in unwritten:
                states.move_to_end(key)
                continue
            state = states.pop(key)
            if self.windowed and has_open_window(state.value):
                states[key] = state
                stamps[key] = now
                continue
            del stamps[key]
            self.encoded_bytes -= state.size
            expired += 1
        self.expired += expired
        return expired

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
            self.stamps.pop(key, None)
            evicted += 1
        self.evictions += evicted
        return evicted

    def clear(self) -> None:
        """Drop every state (after a rebalance); refuses while one is not written."""
        if self.dirty or self.unwritten:
            raise RuntimeError(f"forget() with unpersisted states in {self.spec.id!r}")
        self.states.clear()
        self.stamps.clear()
        self.encoded_bytes = 0

    def take_closed(self) -> dict[tuple[str, int], Any]:
        """Closed windows (key, start) -> final value, to be written before the states."""
        taken, self.closed = self.closed, {}
        return taken


def has_open_window(value: Any) -> bool:
    """Whether a windowed state has an open window (a state no onceflow step wrote counts
    as open: it is kept, never dropped on a guess)."""
    if type(value) is not dict:
        return True
    opened = value.get("open")
    return type(opened) is not dict or bool(opened)
