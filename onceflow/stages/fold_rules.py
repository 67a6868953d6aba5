"""The fold rules, each written once: every path through the aggregates calls these.

The general path (``general_path``: any plan) and the fused paths (``single_fold``:
stateless steps then one aggregate; ``window_fold``: stateless steps then windowed
aggregates) differ only in how they find a record's keys and values, never in what
they do with them:

- **Route watermark** (invariant 2, ``admit``): per key and route, the highest
  position folded; a value at or below it, stored or staged by this record, is a
  duplicate (a replay) and is dropped. A key homed on another input partition fails
  the record at its first value (``touch``).
- **Atomic unit** (invariant 3, ``Staged``, ``install_unit`` and ``install``): a record's new states
  are staged, one per key and aggregate, and installed only once the whole record has
  folded and been checked (``guards.check_state``). A failure raises before
  ``install`` and leaves every state as it was: the stored values are never mutated
  (a key's windows are copied at its record's first change), so nothing rolls back.
- **Event time** (``WindowStage.observe``): every value reaching a windowed stage
  counts towards its input partition's watermark first, replays and stopped values
  too (``stages.watermark``: the watermark is a function of the partition's records).
- **Late decision** (``fold_window``): the key's windows the watermark passed close
  first; a value whose window is closed then is late (not folded); the rest fold.
- **Stopped values** (``stop``, ``is_stopped``): a value an aggregate did not fold (a
  replay, a late value) travels no further: later aggregates and republish steps never
  see it, nor anything a flat-map made of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from onceflow.stages.lineage import Position
from onceflow.stages.outcome import KeyHomedElsewhere, StageFailure
from onceflow.stages.state import AggregateState
from onceflow.stages.state_table import StateTable
from onceflow.stages.watermark import FutureEventTime, PartitionWatermark, future_limit
from onceflow.stages.window_clock import WindowClock
from onceflow.stages.windows import closed_to_of, earliest_start, split

#: Not read yet: a key's windows (``Staged.opened``) or its earliest open start
#: (``Staged.first``).
UNREAD: Final[Any] = object()


class Staged:
    """One key's new state within one record (a unit), installed by ``install``."""

    __slots__ = ("admitted", "closed_to", "closing", "first", "key", "mark", "opened", "own",
                 "reopened", "state", "value")

    def __init__(self, key: str, state: AggregateState, mark: Position | None):
        self.key = key
        self.state = state  # the cached state, unchanged until installed
        self.value: Any = state.value  # the new value (windowed: the stored one, read once)
        self.mark = mark  # the route's highest position folded, stored or staged
        self.admitted = False  # a value of this record was admitted: install it
        # Windowed: the open windows (the stored dict until ``own``: copied at the
        # first change), what they are closed up to, their earliest start, the windows
        # this record closed, and whether the open windows changed.
        self.opened: Any = UNREAD
        self.closed_to: Any = None
        self.own = False
        self.first: Any = UNREAD
        self.closing: list[tuple[int, Any]] | None = None
        self.reopened = False


#: One aggregate's part of a unit: its table, its clock (windowed), its keys' new states.
Share = tuple[StateTable, "WindowClock | None", Iterable[Staged]]


def touch(table: StateTable, key: str, route: Any, fed_from: Any, check_home: bool
          ) -> Staged:
    """A key met by a record for the first time: its state staged, with the route's mark;
    StageFailure if another input partition feeds it (``check_home``: several workers)."""
    state = table.states[key]
    if check_home and state.home != fed_from:
        raise StageFailure(table.spec.id, KeyHomedElsewhere(key, fed_from,
                                                            state.home or fed_from))
    return Staged(key, state, state.watermarks.get(route))


def admit(staged: Staged, pos: Position) -> bool:
    """The route-watermark rule: True if the value at ``pos`` is new for its key on its
    route (above every position folded, stored or staged), and it raises the mark; False
    for a duplicate, to be dropped and stopped."""
    mark = staged.mark
    if mark is not None and pos <= mark:
        return False
    staged.mark = pos
    staged.admitted = True
    return True


def install_unit(unit: list[Share], route: Any, fed_from: Any) -> None:
    """The unit's install: each aggregate's part (``install``), once the whole record has
    folded and been checked."""
    for table, clock, staged_keys in unit:
        install(table, clock, staged_keys, route, fed_from)


def install(table: StateTable, clock: WindowClock | None, staged_keys: Iterable[Staged],
            route: Any, fed_from: Any) -> None:
    """Install one aggregate's part of a unit (``install_key`` for each of its keys). Only
    once the whole record has folded and been checked (``install_unit``)."""
    for staged in staged_keys:
        install_key(table, clock, staged, route, fed_from)


def install_key(table: StateTable, clock: WindowClock | None, staged: Staged, route: Any,
                fed_from: Any) -> None:
    """Install one key's new state if a value of it was admitted: the state, its route
    mark, the windows it closed (history rows) and its open-window index entry."""
    if not staged.admitted:
        return
    key, state, mark = staged.key, staged.state, staged.mark
    assert mark is not None  # admitted
    if staged.opened is not UNREAD:
        staged.value = {"open": staged.opened, "max_ts": staged.closed_to}
    state.value = staged.value
    state.watermarks[route] = mark
    table.dirty.add(key)
    if clock is not None:
        state.home = fed_from  # the partition whose watermark closes its windows, stored
        clock.note(key, fed_from, staged.value, staged.reopened)
    closing = staged.closing
    if closing:
        history = table.closed
        for start, final in closing:
            history[(key, start)] = final


#: Values an aggregate did not fold: (their positions' length, the positions).
Stopped = list[tuple[int, set[Position]]]


def stop(stopped: Stopped, positions: set[Position]) -> None:
    """Values an aggregate did not fold (``positions``, of one length) go no further."""
    if positions:
        stopped.append((len(next(iter(positions))), positions))


def is_stopped(position: Position, stopped: Stopped) -> bool:
    """True if ``position`` is, or derives from, a value an earlier aggregate did not fold."""
    return any(position[:length] in positions for length, positions in stopped)


class WindowStage:
    """A windowed aggregate's rules at hand: its event time, its clock, its fold.

    ``begin`` sets it for a record, ``observe`` counts each value's event time,
    ``fold_window`` folds it or finds it late. Its counts are a fused path's (one
    update of the outcome per batch).
    """

    __slots__ = ("bounded", "clock", "event_time", "fed_from", "fold", "folded", "highest",
                 "id", "init", "key", "late", "mark", "max_bytes", "moved", "replayed", "size",
                 "slot", "slot_start", "span", "table")

    def __init__(self, key: Callable[[Any], Any], table: StateTable, clock: WindowClock):
        window = table.spec.window
        assert window is not None
        self.id, self.key, self.table, self.clock = table.spec.id, key, table, clock
        self.fold: Callable[[Any, Any], Any] = table.spec.fold
        self.init: Callable[[], Any] = table.spec.init
        self.event_time: Callable[[Any], Any] = window.event_time_ms
        self.size = window.size_ms
        self.span = window.size_ms + window.allowed_lateness_ms  # a window's start to its close
        self.max_bytes = table.max_bytes
        self.folded = self.replayed = self.late = 0  # a fused path's, until it counts them
        self.slot, self.slot_start = "-1", -1  # the last window folded into: JSON key, start
        self.mark: PartitionWatermark | None = None  # the record's input partition's
        self.fed_from: Any = None
        self.bounded, self.highest, self.moved = False, 0, False

    def begin(self, fed_from: Any, timestamp: int | None) -> PartitionWatermark:
        """A record from ``fed_from`` (a ``TopicPartition``; its Kafka ``timestamp`` bounds
        its event times): answers its partition's watermark, read back when first met."""
        clock = self.clock
        partitions: dict[Any, PartitionWatermark] = clock.watermark.partitions
        if fed_from not in partitions:
            clock.meet(fed_from)
        mark = self.mark = partitions[fed_from]
        limit = future_limit(timestamp, clock.max_future_ms)
        self.bounded = limit is not None
        self.highest = limit if limit is not None else 0
        self.moved = False  # the partition's maxima changed: marked dirty once per record
        self.fed_from = fed_from
        return mark

    def observe(self, root: Any, value: Any) -> int:
        """A value's event time (``int()`` of what the user's function answers), counted
        towards the watermark (``begin`` came first); FutureEventTime, before counting, for
        one too far ahead of its record's timestamp."""
        stamp: Any = self.event_time(value)
        if type(stamp) is not int:
            stamp = int(stamp)
        ts: int = stamp
        if self.bounded and ts > self.highest:  # it would close every window
            max_future = self.clock.max_future_ms
            raise FutureEventTime(ts, self.highest - max_future, max_future)
        mark = self.mark
        assert mark is not None
        if mark.observe(root, stamp) and not self.moved:
            self.clock.watermark.dirty.add(self.fed_from)
            self.moved = True
        return ts


def fold_window(stage: WindowStage, staged: Staged, value: Any, ts: int, watermark: Any
                ) -> Any:
    """The late decision and the windowed fold of one admitted value at event time ``ts``,
    against its partition's ``watermark`` (None: none yet): None when folded (into
    ``stage.slot``), else by how many ms its window had closed.

    First the key's windows the watermark passed close (it may have risen since the
    key's last value); then a value whose window closes at or before what the key is
    closed up to is late; the rest fold into their window. A damaged stored state
    raises here, as a fold would.
    """
    if staged.opened is UNREAD:
        windows: Any = staged.value
        staged.closed_to = closed_to_of(windows)
        staged.opened = windows["open"]
    span = stage.span
    start = ts - ts % stage.size
    closed_to: Any = staged.closed_to
    if watermark is not None and (closed_to is None or watermark > closed_to):
        _close_passed(stage, staged, watermark)
        closed_to = watermark
    if closed_to is not None:
        closed_ms: int = closed_to
        behind = closed_ms - start - span
        if behind >= 0:
            return behind
    opened = staged.opened
    if not staged.own:
        opened = staged.opened = dict(opened)
        staged.own = True
    if start != stage.slot_start:  # JSON object keys are strings: one per window
        stage.slot, stage.slot_start = str(start), start
    slot = stage.slot
    if slot in opened:
        opened[slot] = stage.fold(opened[slot], value)
        return None
    opened[slot] = stage.fold(stage.init(), value)
    staged.reopened = True
    first = staged.first
    if first is not UNREAD and (first is None or start < first):
        staged.first = start
    return None


def _close_passed(stage: WindowStage, staged: Staged, watermark: int) -> None:
    """Close the key's windows ``watermark`` has passed; the key is then closed up to it.

    The earliest open start comes from the clock's open-window index while the record
    has not changed the key's windows and the index lists the key for this partition
    (it is kept for every installed state, as the sweep needs it), else from the
    windows: a rising watermark with nothing due costs a comparison.
    """
    span = stage.span
    last_start = watermark - span  # windows starting there or before close
    first = staged.first
    if first is UNREAD:
        known: Any = None if staged.own else stage.clock.open.keys.get(staged.key)
        if known is not None and known[0] == stage.fed_from and known[1] is not None:
            first = known[1] - span
        else:
            first = earliest_start(staged.opened)
        staged.first = first
    if first is not None and first <= last_start:
        opened, closed = split(staged.opened, last_start)
        if opened is staged.opened:  # nothing due after all: still a copy of its own
            opened = dict(opened)
        staged.opened = opened
        staged.own = True
        staged.first = earliest_start(opened)
        staged.closing = [*(staged.closing or ()), *closed]
        staged.reopened = True
    staged.closed_to = watermark
