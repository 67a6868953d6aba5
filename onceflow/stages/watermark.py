"""Event-time progress of a windowed stage: when its windows may close.

Per input partition the stage is consumed from, and per root partition
(``stages.lineage``) of the records that reach it through there, the highest
event time seen (replays and duplicates included: they are real progress).
The partition's *watermark* is the minimum over those root partitions, as
Flink's is: after a re-keying hop a key's events come from many root
partitions through its one input partition (its home), and a window closes
only once every one of them has passed its end plus the allowed lateness,
so a lagging upstream (a republisher killed and catching up) holds windows
open instead of making its events late.

Idle roots: a root partition more than ``idle_ms`` of event time behind the
most advanced one of the same input partition stops holding the watermark
(``max(lowest, highest - idle_ms)``), so a root partition that went silent
does not stop every window. Event time, not the wall clock, on purpose: the
watermark at each record is then a function of the input partition's
records up to it, which a replay meets in the same order, so a replay
decides every value as the first run did (``side_outputs`` keeps a second
line of defence). The watermark never goes down.

A root partition the stage has never met cannot hold the watermark: nothing
says it exists. So an input partition met with no row written yet (the
stage's first start) holds its watermark until its event time has advanced
``idle_ms`` past the first event met there (``hold_new``): a root partition
whose first events are less than that behind is waited for.

Far-future event times: a value whose event time is more than the stage's
``max_future_ms`` (``onceflow.windows.max-future``, or ``Tumbling(max_future_ms=)``)
ahead of its record's Kafka timestamp is refused before it is observed
(``FutureEventTime``: its record is dead-lettered), so one bad device clock cannot
raise the watermark and make every later value of its partition late. The record
is the one consumed here: for a source record its producer's CreateTime or the
broker's LogAppendTime, for a record of a repartition or republish topic the time
the upstream worker produced it (onceflow's clock, never a device's; later than
the root's by the pipeline's lag, which only widens the bound). Not the envelope's
event time: a republish step may set it from the value. A replay meets the same
record, so it decides the same. Far-past values are not bounded: they are late
when their window has closed, as any value.

The maxima are written per input partition (a row of the reserved stage
``__windows__``, key ``<stage>|wm|<topic>|<partition>``) after the states of
each snapshot, and read back on assignment, before any record: never ahead
of what the states hold, and a restarted worker continues from exactly the
watermark its states were written with.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from onceflow.stages.declarations import WINDOWS_STAGE as WINDOWS_STAGE  # a reserved id
from onceflow.stages.lineage import RootPartition
from onceflow.stages.state import TopicPartition
from onceflow.stages.windows import earliest_start

#: Reads rows of ``WINDOWS_STAGE`` from a store: keys -> the rows found.
RowLoader = Callable[[str, Iterable[str]], Mapping[str, bytes]]


def row_key(stage_id: str, kind: str, tp: TopicPartition) -> str:
    return f"{stage_id}|{kind}|{tp[0]}|{tp[1]}"


class FutureEventTime(ValueError):
    """A value's event time too far ahead of its record's Kafka timestamp (the reason of
    its record's dead letter)."""

    def __init__(self, event_time_ms: int, timestamp_ms: int, max_future_ms: int):
        ahead = event_time_ms - timestamp_ms
        super().__init__(f"event time {event_time_ms} is {span(ahead)} ({ahead} ms) ahead of "
                         f"its record's Kafka timestamp {timestamp_ms}, more than max-future "
                         f"{span(max_future_ms)}: a wrong clock upstream? (it would close "
                         f"every window of its partition)")


def span(ms: int) -> str:
    """A duration for a reason, e.g. ``3650d``, ``1h``, ``1.5m``, ``250ms``."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:.4g}{unit}"
    return f"{ms}ms"


def future_limit(timestamp_ms: int | None, max_future_ms: int) -> int | None:
    """The highest event time a value of a record with this Kafka timestamp may have;
    None without a timestamp (None, or negative: Kafka's -1 is none)."""
    if timestamp_ms is None or timestamp_ms < 0:
        return None
    return timestamp_ms + max_future_ms


class PartitionWatermark:
    """The watermark of one input partition of a windowed stage."""

    __slots__ = ("held_until", "idle_ms", "low", "roots", "top", "value")

    def __init__(self, idle_ms: int, roots: dict[RootPartition, int] | None = None,
                 held_until: int | None = None, value: int | None = None):
        self.idle_ms = idle_ms
        self.roots = roots or {}
        self.held_until = held_until  # no watermark before the top reaches it (hold_new; -1:
        # set at the first event)
        self.value = value
        self.top = max(self.roots.values(), default=None)
        self.low = min(self.roots.values(), default=None)

    def observe(self, root: Any, ts: Any) -> bool:
        """An event of ``root`` (a ``RootPartition``) at ``ts`` (an ``int``); True
        when the partition's maxima changed. Once per value reaching a windowed stage."""
        roots = self.roots
        seen: Any = roots.get(root)
        if seen is not None and ts <= seen:
            return False
        roots[root] = ts
        top: Any = self.top
        if top is None or ts > top:
            top = self.top = ts
        low: Any = self.low
        if seen is None or seen == low:  # the lowest root moved (or a new one came)
            low = ts
            others: Any = roots.values()
            for other in others:
                if other < low:
                    low = other
            self.low = low
        held = self.held_until
        if held is not None:
            if held == -1:  # a first start: held until idle_ms past its first event
                held = self.held_until = ts + self.idle_ms
            if top < held:
                return True
            self.held_until = None
        mark: int = top  # max(low, top - idle_ms)
        mark -= self.idle_ms
        lowest: int = low
        if lowest > mark:
            mark = lowest
        value = self.value
        if value is None or mark > value:
            self.value = mark
        return True

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"r": [[t, p, ts] for (t, p), ts in sorted(self.roots.items())],
                               "v": self.value}
        if self.held_until is not None:
            doc["h"] = self.held_until
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, row: bytes, idle_ms: int) -> PartitionWatermark:
        doc = json.loads(row)
        return cls(idle_ms, {(t, p): ts for t, p, ts in doc["r"]}, doc.get("h"), doc["v"])


class StageWatermark:
    """The watermarks of one windowed stage's input partitions on this worker."""

    def __init__(self, stage_id: str, idle_ms: int, hold_new: bool = False):
        self.stage_id = stage_id
        self.idle_ms = idle_ms
        self.hold_new = hold_new
        self.partitions: dict[TopicPartition, PartitionWatermark] = {}
        self.dirty: set[TopicPartition] = set()

    def install(self, tp: TopicPartition, row: bytes | None) -> None:
        """The row read back for an input partition (None: nothing written yet; it is
        written at the next snapshot, even empty, so a restart holds nothing)."""
        if row is not None:
            self.partitions[tp] = PartitionWatermark.decode(row, self.idle_ms)
            return
        self.partitions[tp] = PartitionWatermark(self.idle_ms)
        self.dirty.add(tp)
        if self.hold_new:
            self.partitions[tp].held_until = -1  # set at the first event

    def take_rows(self) -> dict[str, bytes]:
        """The changed partitions' rows, to be written after the snapshot's states."""
        rows = {row_key(self.stage_id, "wm", tp): self.partitions[tp].encode()
                for tp in sorted(self.dirty) if tp in self.partitions}
        self.dirty = set()
        return rows

    def forget(self) -> None:
        """Drop everything (a rebalance): partitions are read back when met again."""
        self.partitions.clear()
        self.dirty.clear()


class OpenWindows:
    """Which keys of a windowed stage hold open windows, per input partition, with the
    event time their earliest window closes at (None: not known since read back).

    It outlives the state cache (a key evicted with open windows stays here), so a key
    that went silent still has its windows closed when the watermark passes them. It is
    written per input partition (key ``<stage>|open|<topic>|<partition>``, a JSON list
    of keys) BEFORE the states of each snapshot, as the union of the keys open now and
    at the previous snapshot: whatever mix of this and the previous snapshot's states a
    crash leaves in the store, every state with an open window is listed. A key listed
    without one is read once and dropped.
    """

    def __init__(self, stage_id: str):
        self.stage_id = stage_id
        self.keys: dict[str, tuple[TopicPartition, int | None]] = {}
        self._by_tp: dict[TopicPartition, set[str]] = {}
        self._previous: dict[TopicPartition, set[str]] = {}  # open at the last snapshot
        self._written: dict[TopicPartition, set[str]] = {}  # the rows as last written
        self._changed: set[TopicPartition] = set()
        self._shrinking: set[TopicPartition] = set()
        self._heaps: dict[TopicPartition, list[tuple[int, str]]] = {}  # stale entries skipped
        self._unknown: dict[TopicPartition, set[str]] = {}  # read back, close not known yet

    def install(self, tp: TopicPartition, row: bytes | None) -> None:
        """The keys read back for an input partition; their close times are unknown."""
        keys = set() if row is None else set(json.loads(row))
        self._by_tp.setdefault(tp, set())
        self._previous[tp] = set(keys)  # any of them may be open in the store
        self._written[tp] = set(keys)
        for key in keys:
            if key not in self.keys:
                self.note(key, tp, None, known=False)

    def note(self, key: str, tp: Any, closes_at: int | None, known: bool = True) -> None:
        """A key's earliest open window now closes at ``closes_at`` (None with ``known``:
        it has no open window any more); ``tp``: the ``TopicPartition`` feeding it."""
        old: Any = self.keys.get(key)
        if known and closes_at is None:
            if old is not None:
                del self.keys[key]
                self._by_tp[old[0]].discard(key)
                self._changed.add(old[0])
            return
        if old is not None and old[0] != tp:  # fed from another partition (single worker)
            self._by_tp[old[0]].discard(key)
            self._changed.add(old[0])
            old = None
        self.keys[key] = (tp, closes_at)
        if closes_at is None:
            self._unknown.setdefault(tp, set()).add(key)
        elif old is None or old[1] != closes_at:
            heapq.heappush(self._heaps.setdefault(tp, []), (closes_at, key))
        if old is None:
            self._by_tp.setdefault(tp, set()).add(key)
            self._changed.add(tp)

    def due(self, tp: TopicPartition, watermark: int) -> list[str]:
        """Keys fed from ``tp`` whose earliest window closes at or before ``watermark``, or
        is unknown (taken: the caller notes each again)."""
        keys = self.keys
        # A key read back for ``tp`` and since fed from another partition is that one's.
        due = {key for key in self._unknown.pop(tp, ()) if key in keys and keys[key][0] == tp}
        heap = self._heaps.get(tp, [])
        while heap and heap[0][0] <= watermark:
            closes_at, key = heapq.heappop(heap)
            entry = keys.get(key)
            if entry is not None and entry == (tp, closes_at):
                due.add(key)
        return sorted(due)

    def take_rows(self) -> dict[str, bytes]:
        """The rows that changed, to be written before the snapshot's states."""
        rows = {}
        visit = self._changed | self._shrinking
        for tp in sorted(visit):
            now = set(self._by_tp.get(tp, ()))
            listed = now | self._previous.get(tp, set())
            if listed != self._written.get(tp):
                rows[row_key(self.stage_id, "open", tp)] = json.dumps(
                    sorted(listed), separators=(",", ":")).encode()
                self._written[tp] = listed
            self._previous[tp] = now
        # Keys that closed are dropped from the row one snapshot later.
        self._shrinking = {tp for tp in visit if self._written.get(tp) != self._previous[tp]}
        self._changed = set()
        return rows

    def forget(self) -> None:
        self.keys.clear()
        self._by_tp.clear()
        self._previous.clear()
        self._written.clear()
        self._changed.clear()
        self._shrinking.clear()
        self._heaps.clear()
        self._unknown.clear()


def earliest_close(opened: Mapping[str, object], size_ms: int, lateness_ms: int) -> int | None:
    """When the earliest of a state's open windows closes; None without one."""
    first = earliest_start(opened)
    return None if first is None else first + size_ms + lateness_ms
