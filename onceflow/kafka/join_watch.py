"""Bound how long a consumer may spend joining its group.

A consumer that is joining (its first join, or a rebalance) holds no
partitions, fetches nothing and has no lag to report, so neither the
connection checker (the broker answers) nor the stall check (no lag) sees
it. A broker can leave a group stuck: the local broker once kept a group
without a leader for minutes after a member left during a rebalance. The
watch keeps when the current join began; ``enforce`` fails the stream once
it is older than ``onceflow.kafka.join-timeout``, so the supervisor
re-creates the consumer (a new member, a new join), as it does after
``ConnectionLost``.

Joins are seen through the rebalance listener (public aiokafka API): a join
begins when the stream is created and when ``on_partitions_revoked`` has
run (aiokafka calls it before every JoinGroup, with an empty set on the
first one), and ends at ``on_partitions_assigned`` (after SyncGroup). It is
what aiokafka's ``SubscriptionState.reassignment_in_progress`` tracks
internally, without our revocation flush counted as joining time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from onceflow.actors import metrics

log = logging.getLogger(__name__)


class JoinTimeout(TimeoutError):
    """The consumer did not complete a group join within the join timeout."""


class JoinWatch:
    """When the current group join began, if one is under way.

    Written on the consumer's event loop, read by ``/health`` from another
    thread: the fields are plain floats replaced whole, so a reader sees one
    consistent value or the other.
    """

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.timeout = timeout
        self._clock, self._wall = clock, wall
        self._since: tuple[float, float] | None = None  # (monotonic, epoch) of the join start

    def joining(self) -> None:
        """A join began; a join already under way keeps its start."""
        if self._since is None:
            self._since = (self._clock(), self._wall())

    def joined(self) -> None:
        self._since = None

    def seconds(self) -> float | None:
        """How long the current join has taken, None when not joining."""
        since = self._since
        return None if since is None else self._clock() - since[0]

    def overdue(self) -> bool:
        return self._past_due(self.seconds())

    def _past_due(self, seconds: float | None) -> bool:
        """Whether a join that has taken ``seconds`` (None: none under way) is overdue."""
        return seconds is not None and seconds > self.timeout

    def until_due(self) -> float:
        """Seconds until the current join is overdue (the full timeout when not joining)."""
        seconds = self.seconds()
        return self.timeout if seconds is None else max(0.0, self.timeout - seconds)

    def report(self) -> dict[str, Any]:
        """What ``/health`` shows of the consumer's group membership."""
        since, seconds = self._since, self.seconds()
        return {
            "joining": since is not None,
            "joining_since": None if since is None else
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since[1])),
            # rounded up: an overdue join never shows the timeout itself
            "joining_seconds": None if seconds is None else math.ceil(seconds * 1000) / 1000,
            "join_timeout": self.timeout,
            "join_overdue": self._past_due(seconds),  # the same reading as the seconds
        }


async def enforce(watch: JoinWatch, max_interval: float = 1.0) -> None:
    """Raise ``JoinTimeout`` once the current join is overdue; runs as long as the stream.

    Looks at least every ``max_interval`` seconds, so a join that begins
    while it sleeps is caught within that much of its bound.
    """
    while True:
        await asyncio.sleep(min(max_interval, watch.until_due()) + 0.01)
        seconds = watch.seconds()
        if watch.overdue() and seconds is not None:
            metrics.JOIN_TIMEOUTS.inc()
            log.error("group join not complete after %.1fs (join-timeout %.1fs): "
                      "re-creating the consumer", seconds, watch.timeout)
            raise JoinTimeout(f"group join not complete after {seconds:.1f}s")
