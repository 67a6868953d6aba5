"""The input logs checked again before anything leaves the worker: a topic re-created under it.

``log_marks.LogCheck`` runs on assignment. A topic deleted and re-created
while the worker holds its partitions gives no assignment: the broker serves
the new log from the consumer's position as if it were the old one, so the
new log's records below that position are never read and those above it are
folded as if they followed the old ones, silently (the rewind guard,
``kafka.continuity``, sees it only while the new log still ends below the
position). So before a batch's outputs are sent, and before a snapshot is
written, the partitions they come from are checked at their *anchor*: the
last record of that partition whose effects are already durable (the mark
written with the previous snapshot, or the one checked on assignment), else
the first batch's last record seen since the assignment. The check must
have *begun after* the batch was handed over, so it saw the log the batch
was read from: a log that no longer holds the anchor's record was replaced,
and ``LogReplaced`` (exit 1) fails the sends and the write. Nothing of the
new log reaches an output topic, a store or a commit: the stores keep the
old log's states and marks, the restart refuses the new log on assignment,
and ``onceflow forget --topic T`` lets it be counted exactly, downstream too.

One check serves every send and write waiting when it begins (``checked``):
one fetch of one record per partition, by a probe consumer kept open, and
at most one check every ``SPACING`` seconds, so a busy worker pays a few
checks a second and a send waits at most about ``SPACING`` plus two checks.
A check that cannot reach the broker is retried with backoff while the
sends and the write wait: nothing leaves unverified, and a broker outage
does not restart the core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from onceflow.checkpoint.log_marks import LogMark, LogReplaced
from onceflow.stages.state import TopicPartition

log = logging.getLogger(__name__)

#: The check's retry when the broker does not answer: first wait, and at most (seconds).
RETRY_FIRST, RETRY_MAX = 0.5, 5.0
#: At most one check begins per this many seconds (a send waits about this much at most).
SPACING = 0.05


class Holds(Protocol):
    """``LogCheck.holds``: raise ``LogReplaced`` for a log that lost its mark's record."""

    async def holds(self, marks: Mapping[TopicPartition, LogMark]) -> None: ...


class LogWatch:
    """Anchors per assigned partition; the checks the sends and writes wait for. On the
    loop only."""

    def __init__(self) -> None:
        self._check: Holds | None = None
        self._anchors: dict[TopicPartition, LogMark] = {}
        #: Waiting for a check begun after them: each with its partitions (empty: all).
        self._waiting: list[tuple[frozenset[TopicPartition], asyncio.Future[None]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._last_began = float("-inf")
        self._refused: LogReplaced | None = None

    def assigned(self, check: Holds | None, partitions: Iterable[TopicPartition],
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

    async def checked(self, partitions: Iterable[TopicPartition] = ()) -> None:
        """Once a check begun after this call found every anchored partition of
        ``partitions`` (all when empty) holding its anchor's record; ``LogReplaced`` if
        one does not. Waits (retrying) while the broker cannot tell."""
        if self._refused is not None:
            raise self._refused
        if self._check is None or not self._anchors:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((frozenset(partitions), waiter))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        await waiter

    async def verify(self, advanced: Mapping[TopicPartition, LogMark]) -> None:
        """Before a snapshot advancing ``advanced`` is written (``checked``)."""
        if advanced:
            await self.checked(advanced)

    def written(self, advanced: Mapping[TopicPartition, LogMark]) -> None:
        """A snapshot was written: its last records are the new anchors."""
        self._anchors.update(advanced)

    async def _run(self) -> None:
        """Checks, one after another, while anyone waits for one."""
        loop = asyncio.get_running_loop()
        wait = RETRY_FIRST
        while self._waiting:
            await asyncio.sleep(max(0.0, self._last_began + SPACING - loop.time()))
            due, self._waiting = self._waiting, []
            self._last_began = loop.time()
            try:
                await self._check_anchors(due)
            except LogReplaced as refused:
                self._refused = refused
                for _, waiter in [*due, *self._waiting]:
                    if not waiter.done():
                        waiter.set_exception(refused)
                self._waiting = []
                return
            except Exception as error:  # a broker that does not answer: not a verdict
                self._waiting[:0] = due
                log.warning("cannot check that the input logs still hold the records "
                            "already folded (%r); sends and the snapshot wait, retrying "
                            "in %.1fs", error, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MAX)
                continue
            wait = RETRY_FIRST
            for _, waiter in due:
                if not waiter.done():
                    waiter.set_result(None)

    async def _check_anchors(
            self, due: list[tuple[frozenset[TopicPartition], asyncio.Future[None]]]) -> None:
        wanted: set[TopicPartition] = set()
        for partitions, _ in due:
            wanted |= partitions or self._anchors.keys()
        anchors = {tp: self._anchors[tp] for tp in wanted if tp in self._anchors}
        if self._check is not None and anchors:
            await self._check.holds(anchors)
