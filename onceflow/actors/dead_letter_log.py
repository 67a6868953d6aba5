"""Dead letters are not silent: the first per stage and reason at WARNING, then counts.

A topic whose every record is dead-lettered (a wrong format, a decoder bug)
must show in the log, not only in a counter. The first dead letter of each
(stage, kind of reason) is logged with its reason; later ones are counted
and logged per stage at most once per ``interval`` seconds, so a flood of
bad records costs one line per stage per interval.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping

#: The records of keys homed elsewhere have their own warning (``onceflow_misaligned_records``).
_OWN_WARNING = "KeyHomedElsewhere"
INTERVAL_SECONDS = 10.0


class DeadLetterWarnings:
    """Logs a worker's dead letters at WARNING, rate-limited per stage."""

    def __init__(self, log: logging.Logger, interval: float = INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self._log = log
        self._interval = interval
        self._clock = clock
        self._seen: set[tuple[str, str]] = set()
        self._unlogged: Counter[str] = Counter()  # stage -> dead letters not logged yet
        self._last: dict[str, float] = {}  # stage -> when a line was last logged

    def record(self, counts: Mapping[tuple[str, str], int],
               first: Mapping[tuple[str, str], str]) -> None:
        """A batch's dead letters: (stage, kind) -> count, and the first reason of each."""
        now = self._clock()
        for (stage, kind), n in counts.items():
            if kind == _OWN_WARNING:
                continue
            if (stage, kind) not in self._seen:
                self._seen.add((stage, kind))
                self._last[stage] = now
                self._log.warning("dead-lettered a record in stage %r: %s (further dead letters "
                                  "are counted here at most every %gs, and in "
                                  "onceflow_dead_letters)", stage, first[(stage, kind)],
                                  self._interval)
                n -= 1
            if n:
                self._unlogged[stage] += n
        self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Log the counts of stages whose last line is at least ``interval`` old."""
        now = self._clock() if now is None else now
        for stage, n in list(self._unlogged.items()):
            last = self._last.get(stage)
            if n and (last is None or now - last >= self._interval):
                self._log.warning("%d more records dead-lettered in stage %r in the last %.0fs",
                                  n, stage, now - last if last is not None else 0)
                self._last[stage] = now
                del self._unlogged[stage]
