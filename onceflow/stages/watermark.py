"""Event-time progress of a windowed stage: when its windows may close.

Per input partition the stage is consumed from, and per root partition
(``stages.lineage``) of the records that reach it through there, the highest
event time seen (replays and duplicates included: they are real progress).
The stage's *watermark* is the minimum over those root partitions, as
Flink's is: after a re-keying hop a key's events come from many root
partitions, and a window closes only once every one of them has passed its
end plus the allowed lateness, so a lagging upstream (a republisher killed
and catching up) holds windows open instead of making its events late.

A root partition whose highest event time has not risen for ``idle_timeout``
(wall-clock seconds on this worker) no longer holds the watermark back: a
silent partition would otherwise stop every window. The cost: events of a
root partition that was silent longer than that can arrive after windows
the others closed, and are late. With every partition idle the watermark
stays where it is. It never goes down on a worker (an idle partition that
resumes behind it does not reopen anything).

A root partition the stage has never met cannot hold the watermark: nothing
says it exists. So an input partition met with no row written yet (the
stage's first start) holds the watermark for ``idle_timeout`` (``hold_new``),
as if every root partition feeding it were met and idle since then: a root
partition whose first events arrive within that time is waited for.

The maxima are written per input partition (a row of the reserved stage
``__windows__``, key ``<stage>|wm|<topic>|<partition>``) after the states of
each snapshot, and read back when a worker first meets that partition: a
restarted worker waits for the same root partitions (each gets a fresh idle
timeout) instead of closing windows on the first partitions that deliver.
Written after the states, a row never claims progress whose folds are not
durable.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Mapping

from onceflow.stages.lineage import RootPartition
from onceflow.stages.state import TopicPartition

#: The reserved stage id of watermark and open-window index rows.
WINDOWS_STAGE = "__windows__"
#: Reads rows of ``WINDOWS_STAGE`` from a store: keys -> the rows found.
RowLoader = Callable[[str, Iterable[str]], Mapping[str, bytes]]


def row_key(stage_id: str, kind: str, tp: TopicPartition) -> str:
    return f"{stage_id}|{kind}|{tp[0]}|{tp[1]}"


class StageWatermark:
    """The watermark of one windowed stage on this worker (see the module docstring)."""

    def __init__(self, stage_id: str, idle_timeout: float, hold_new: bool = False):
        self.stage_id = stage_id
        self.idle_timeout = idle_timeout
        self.hold_new = hold_new
        self._held_until = float("-inf")
        self.now = 0.0  # the batch's wall-clock time (set by the runner once per batch)
        self.maxes: dict[TopicPartition, dict[RootPartition, int]] = {}
        self._risen: dict[tuple[TopicPartition, RootPartition], float] = {}
        self.value: int | None = None
        self.dirty: set[TopicPartition] = set()

    def install(self, tp: TopicPartition, row: bytes | None) -> None:
        """The maxima read back for an input partition (None: nothing written yet)."""
        roots: dict[RootPartition, int] = {}
        if row is None:  # written at the next snapshot, even empty: a restart holds nothing
            self.dirty.add(tp)
            if self.hold_new:
                self._held_until = max(self._held_until, self.now + self.idle_timeout)
        if row is not None:
            roots = {(topic, partition): ts for topic, partition, ts in json.loads(row)}
        self.maxes[tp] = roots
        for root in roots:
            self._risen[(tp, root)] = self.now  # a fresh idle timeout for each

    def observe(self, tp: TopicPartition, root: RootPartition, ts: int) -> None:
        """An event of ``root`` consumed from ``tp`` (``install`` came first)."""
        roots = self.maxes[tp]
        seen = roots.get(root)
        if seen is None or ts > seen:
            roots[root] = ts
            self._risen[(tp, root)] = self.now
            self.dirty.add(tp)

    def advance(self) -> int | None:
        """Recompute the watermark (idle roots left out); answers it (None: unknown yet)."""
        if self.now < self._held_until:
            return self.value
        deadline = self.now - self.idle_timeout
        risen = self._risen
        live = [ts for tp, roots in self.maxes.items() for root, ts in roots.items()
                if risen[(tp, root)] >= deadline]
        if live:
            low = min(live)
            if self.value is None or low > self.value:
                self.value = low
        return self.value

    def take_rows(self) -> dict[str, bytes]:
        """The changed partitions' rows, to be written after the snapshot's states."""
        rows = {row_key(self.stage_id, "wm", tp): json.dumps(
            [[topic, partition, ts] for (topic, partition), ts in sorted(self.maxes[tp].items())],
            separators=(",", ":")).encode() for tp in sorted(self.dirty)}
        self.dirty = set()
        return rows

    def forget(self) -> None:
        """Drop everything (a rebalance): partitions are read back when met again."""
        self.maxes.clear()
        self._risen.clear()
        self.dirty.clear()
        self.value = None
        self._held_until = float("-inf")


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
        self._heap: list[tuple[int, str]] = []  # (close, key), stale entries skipped
        self._unknown: set[str] = set()  # read back, close not known yet

    def install(self, tp: TopicPartition, row: bytes | None) -> None:
        """The keys read back for an input partition; their close times are unknown."""
        keys = set() if row is None else set(json.loads(row))
        self._by_tp.setdefault(tp, set())
        self._previous[tp] = set(keys)  # any of them may be open in the store
        self._written[tp] = set(keys)
        for key in keys:
            if key not in self.keys:
                self.note(key, tp, None, known=False)

    def note(self, key: str, tp: TopicPartition, closes_at: int | None,
             known: bool = True) -> None:
        """A key's earliest open window now closes at ``closes_at`` (None with ``known``:
        it has no open window any more)."""
        old = self.keys.get(key)
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
            self._unknown.add(key)
        elif old is None or old[1] != closes_at:
            heapq.heappush(self._heap, (closes_at, key))
        if old is None:
            self._by_tp.setdefault(tp, set()).add(key)
            self._changed.add(tp)

    def due(self, watermark: int) -> list[str]:
        """Keys whose earliest window closes at or before ``watermark``, or is unknown
        (taken: the caller notes each again)."""
        due, self._unknown = self._unknown & self.keys.keys(), set()
        heap, keys = self._heap, self.keys
        while heap and heap[0][0] <= watermark:
            closes_at, key = heapq.heappop(heap)
            entry = keys.get(key)
            if entry is not None and entry[1] == closes_at:
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
        self._heap.clear()
        self._unknown.clear()


def earliest_close(opened: Mapping[str, object], size_ms: int, lateness_ms: int) -> int | None:
    """When the earliest of a state's open windows closes; None without one."""
    if not opened:
        return None
    return min(map(int, opened)) + size_ms + lateness_ms
