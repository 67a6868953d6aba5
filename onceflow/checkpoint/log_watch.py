"""The log check again before each snapshot is written: a topic re-created while the worker runs.

``log_marks.LogCheck`` runs on assignment. A topic deleted and re-created
while the worker holds its partitions gives no assignment: the broker serves
the new log from the consumer's position as if it were the old one, so the
new log's records below that position are never read and those above it are
folded as if they followed the old ones, silently (the rewind guard,
``kafka.continuity``, sees it only while the new log still ends below the
position). So before the coordinator writes a snapshot, each partition it
advanced is checked at its *anchor*: the last record of that partition whose
effects are already durable (the mark written with the previous snapshot, or
the one checked on assignment), else the first batch's last record seen since
the assignment. A log that no longer holds the anchor's record was replaced
after it was read: ``LogReplaced`` (exit 1) before anything of the snapshot is
written or committed, so the stores keep the old log's states and marks, the
restart refuses the new log on assignment, and ``onceflow forget --topic T``
lets it be counted exactly.

One fetch of one record per advanced partition per snapshot, on the loop,
by a group-less consumer; nothing per record. A check that cannot reach the
broker is retried with backoff while the write waits: nothing becomes
durable unverified, and a broker outage does not restart the core. Outputs
of a republish step are sent before their snapshot is checked: those of the
new log's records read before the check (at most one persistence interval)
are in the output topics and are republished again after the forget.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from onceflow.checkpoint.log_marks import LogCheck, LogMark, LogReplaced
from onceflow.stages.state import TopicPartition

log = logging.getLogger(__name__)

#: The check's retry when the broker does not answer: first wait, and at most (seconds).
RETRY_FIRST, RETRY_MAX = 0.5, 5.0


class LogWatch:
    """Anchors per assigned partition; the check before each write. On the loop only."""

    def __init__(self) -> None:
        self._check: LogCheck | None = None
        self._anchors: dict[TopicPartition, LogMark] = {}

    def assigned(self, check: LogCheck | None, partitions: Iterable[TopicPartition],
                 marks: Mapping[TopicPartition, LogMark]) -> None:
        """An assignment, with the marks ``check`` found in the store for it."""
        self._check = check
        owned = set(partitions)
        self._anchors = {tp: mark for tp, mark in marks.items() if tp in owned}

    def seen(self, marks: Mapping[TopicPartition, LogMark]) -> None:
        """A batch's last record per partition: the anchor of a partition that has none."""
        for tp, mark in marks.items():
            if tp not in self._anchors:
                self._anchors[tp] = mark

    async def verify(self, advanced: Mapping[TopicPartition, LogMark]) -> None:
        """Before a snapshot advancing ``advanced`` is written: raise ``LogReplaced`` if a log
        no longer holds its anchor's record; wait while the broker cannot tell."""
        check = self._check
        due = {tp: self._anchors[tp] for tp in advanced if tp in self._anchors}
        if check is None or not due:
            return
        wait = RETRY_FIRST
        while True:
            try:
                await check.holds(due)
                return
            except LogReplaced:
                raise
            except Exception as error:  # a broker that does not answer: not a verdict
                log.warning("cannot check that %s still hold the records already folded "
                            "(%r); the snapshot waits, retrying in %.1fs", sorted(due), error,
                            wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MAX)

    def written(self, advanced: Mapping[TopicPartition, LogMark]) -> None:
        """A snapshot was written: its last records are the new anchors."""
        self._anchors.update(advanced)
