"""Fetch starvation: a partition whose records wait but whose fetches bring none.

A broker may answer a fetch with no records although the log holds records
past the fetched offset: Tansu (the local broker) walks a partition's batches
to find the offset, about 3 us a batch on a loaded 2-core host, and answers
empty once the fetch's max wait is spent. Past ~100,000 records in 5-record
batches, a 20 ms ``fetch-max-wait`` brought nothing at any offset, for ever:
the worker re-fetched the same offset without an error, a hole or a log line
(issue 29, reproduction 7). Real Kafka answers with what it has at once; the
same symptom there means the client is wedged.

Pure logic, no I/O: after each fetch the consumer tells :meth:`FetchWatch.observe`
each assigned partition's next expected offset, the log end the broker
reported with it, whether records came and whether the partition was paused.
A partition starves while records wait (log end above the expected offset)
and none come; :meth:`observe` answers a :class:`Starved` once it has starved
for ``after`` seconds of unpaused fetching (then counts again from zero).
The consumer acts on it (``fetch_starvation``: a longer max wait, at the
ceiling a re-created stream).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from onceflow.stages.state import TopicPartition


class Starved(NamedTuple):
    """``tp``'s fetches brought no record for ``seconds`` while its log ended at
    ``highwater``, above the ``expected`` offset."""

    tp: TopicPartition
    expected: int
    highwater: int
    seconds: float


class FetchWatch:
    """Seconds each partition has starved, counted only while it was fetchable."""

    def __init__(self, after: float) -> None:
        if after <= 0:
            raise ValueError(f"after must be positive, got {after}")
        self._after = after
        self._starved: dict[TopicPartition, float] = {}  # seconds starved so far
        self._last: dict[TopicPartition, float] = {}  # last unpaused observation

    def observe(self, tp: TopicPartition, now: float, *, expected: int | None,
                highwater: int | None, fetched: bool, paused: bool) -> Starved | None:
        """One fetch's outcome for ``tp`` at time ``now``; a ``Starved`` when it is due."""
        if fetched or expected is None or highwater is None or highwater <= expected:
            self._starved.pop(tp, None)  # progress, or nothing waits: not starving
            self._last.pop(tp, None)
            return None
        if paused:  # not fetched meanwhile: the time does not count
            self._last.pop(tp, None)
            return None
        last, self._last[tp] = self._last.get(tp), now
        if last is None:
            self._starved.setdefault(tp, 0.0)
            return None
        seconds = self._starved.get(tp, 0.0) + now - last
        if seconds < self._after:
            self._starved[tp] = seconds
            return None
        self._starved[tp] = 0.0
        return Starved(tp, expected, highwater, seconds)

    def idle(self) -> None:
        """No partition is fetched until the next observation (all paused meanwhile)."""
        self._last.clear()

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._starved.pop(tp, None)
            self._last.pop(tp, None)
