"""One windowed stage's clock: its watermark, its open-window index, and the sweep
that closes the windows the watermark passed, of every key (``stages.watermark``).

The runner observes each value that reaches the stage and decides it
against its input partition's watermark at that value (a key is fed from
one input partition, its home), and sweeps after each batch: a key that
went silent has its windows closed there, its state read back from the store first if the cache
dropped it (or this worker never held it: the index is read back per input
partition when the worker first meets it). Each closing is a history row
plus a changed state, written by the next snapshot like any other.

With ``single-worker`` a key may be fed from several input partitions: the
last one to feed it closes its windows, and its state names it (``home``), so
a restart closes them there too, even where a read-back index row (which keeps a
key one snapshot after it moved) lists it under another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.stages.state import AggregateState, TopicPartition
from onceflow.stages.state_table import StateTable
from onceflow.stages.watermark import (
    WINDOWS_STAGE,
    OpenWindows,
    RowLoader,
    StageWatermark,
    earliest_close,
    row_key,
)
from onceflow.stages.windows import close_due

if TYPE_CHECKING:
    from onceflow.stages.pipeline import Aggregate

#: Reads aggregate states from the store (the runner's loader).
StateLoader = Callable[["Aggregate", Sequence[str]], Mapping[str, AggregateState]]
#: Default of ``onceflow.windows.idle-timeout``, seconds of event time.
IDLE_TIMEOUT = 300.0
#: Default of ``onceflow.windows.max-future``, seconds an event time may be ahead of its
#: record's Kafka timestamp (``watermark.FutureEventTime``).
MAX_FUTURE = 3600.0


class WindowClock:
    """The watermarks, open-window index and sweep of one windowed aggregate."""

    def __init__(self, table: StateTable, idle_timeout: float = IDLE_TIMEOUT,
                 load_rows: RowLoader | None = None, hold_new: bool = False,
                 max_future: float = MAX_FUTURE):
        window = table.spec.window
        assert window is not None
        self.table = table
        self.window = window
        #: The window's own bound, else the worker's (``watermark.FutureEventTime``).
        self.max_future_ms: int = round(max_future * 1000) if window.max_future_ms is None \
            else window.max_future_ms
        self.watermark = StageWatermark(table.spec.id, round(idle_timeout * 1000), hold_new)
        self.open = OpenWindows(table.spec.id)
        self._swept: dict[TopicPartition, int] = {}  # the watermark each partition swept at
        # Partitions given keys by a sweep: a key read back under one partition whose state
        # names another (``AggregateState.home``: the last to feed it, ``single-worker``).
        self._moved: set[TopicPartition] = set()
        self._load_rows = load_rows

    def meet(self, tp: TopicPartition) -> None:
        """Read back the input partition's watermark and index rows the first time."""
        if tp in self.watermark.partitions:
            return
        keys = [row_key(self.table.spec.id, "wm", tp), row_key(self.table.spec.id, "open", tp)]
        rows = self._load_rows(self.table.spec.store, keys) if self._load_rows else {}
        self.watermark.install(tp, rows.get(keys[0]))
        self.open.install(tp, rows.get(keys[1]))

    def note(self, key: str, tp: Any, state: dict[str, Any], reopened: bool = True) -> None:
        """A key's windowed state changed (fed from ``tp``, a ``TopicPartition``); ``reopened``
        False: the same windows are open as at its last note (nothing to do once known for
        ``tp``). Once per key and record."""
        if not reopened:
            known: Any = self.open.keys.get(key)
            if known is not None and known[0] == tp and known[1] is not None:
                return
        window = self.window
        self.open.note(key, tp, earliest_close(state["open"], window.size_ms,
                                               window.allowed_lateness_ms))

    def sweep(self, load: StateLoader) -> int:
        """Close every key's windows its partition's watermark passed; answers how many
        windows closed."""
        closed = 0
        for tp, mark in self.watermark.partitions.items():
            now = mark.value
            if now is not None and now > self._swept.get(tp, now - 1):
                self._swept[tp] = now
                closed += self._close(tp, now, load)
        while self._moved:  # keys read back under another partition than their state's
            tp = self._moved.pop()
            met = self.watermark.partitions.get(tp)
            if met is not None and met.value is not None:  # else swept once it is met
                closed += self._close(tp, met.value, load)
        return closed

    def _close(self, tp: TopicPartition, now: int, load: StateLoader) -> int:
        table, spec = self.table, self.table.spec
        due = self.open.due(tp, now)
        missing = [key for key in due if key not in table.states]
        if missing:
            loaded = load(spec, missing)
            for key in missing:
                if key in loaded:
                    table.install(key, loaded[key])
                else:  # listed before its state was written, and that write never came
                    self.open.note(key, tp, None)
        closed = 0
        for key in due:
            state = table.states.get(key)
            if state is None:
                continue
            home = state.home
            if home is not None and home != tp:  # listed here, last fed from elsewhere
                self.open.note(key, home, None, known=False)
                self._moved.add(home)
                continue
            step = close_due(self.window, state.value, now)
            if step.state is not state.value:
                state.value = step.state
                table.dirty.add(key)
            for start, final in step.closed:
                table.closed[(key, start)] = final
            closed += len(step.closed)
            self.note(key, tp, state.value)
        return closed

    def rows_before_states(self) -> dict[str, bytes]:
        """The index rows of a snapshot (``WINDOWS_STAGE``): written before its states."""
        return self.open.take_rows()

    def rows_after_states(self) -> dict[str, bytes]:
        """The watermark rows of a snapshot: written after its states."""
        return self.watermark.take_rows()

    def forget(self) -> None:
        """A rebalance: everything is read back per partition when met again."""
        self.watermark.forget()
        self.open.forget()
        self._swept.clear()
        self._moved.clear()


__all__ = ["IDLE_TIMEOUT", "MAX_FUTURE", "WINDOWS_STAGE", "WindowClock"]
