"""JoinWatch's timing and ``enforce``; EventLoopThread.stop waking whoever waits on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from onceflow.actors import metrics
from onceflow.actors.loop import EventLoopThread
from onceflow.kafka.join_watch import JoinTimeout, JoinWatch, enforce


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_join_is_timed_from_its_first_start_until_assigned() -> None:
    clock = Clock()
    watch = JoinWatch(120.0, clock=clock, wall=lambda: 1_767_225_600.0)
    assert watch.report() == {"joining": False, "joining_since": None, "joining_seconds": None,
                              "join_timeout": 120.0, "join_overdue": False}
    watch.joining()
    clock.now += 100
    watch.joining()  # the revocation callback of the same join: keeps its start
    clock.now += 20
    assert watch.seconds() == 120.0
    assert not watch.overdue() and watch.until_due() == 0.0
    clock.now += 0.5
    assert watch.overdue()
    assert watch.report() == {"joining": True, "joining_since": "2026-01-01T00:00:00Z",
                              "joining_seconds": 120.5, "join_timeout": 120.0,
                              "join_overdue": True}
    watch.joined()
    assert not watch.overdue() and watch.seconds() is None and watch.until_due() == 120.0
    watch.joining()  # the next rebalance starts a new clock
    assert watch.seconds() == 0.0


def test_one_report_reads_the_clock_once_and_an_overdue_join_shows_more_than_the_timeout(
) -> None:
    """The clock moves between reads (a busy loop): the report's seconds and its verdict
    come from one reading, rounded up, so an overdue join never shows the timeout itself
    (an e2e test once saw ``joining_seconds`` 8.0 with ``join_overdue`` true at 8.0)."""
    readings = iter([1000.0, 1007.9999, 1008.0001, 1008.0002])
    watch = JoinWatch(8.0, clock=lambda: next(readings), wall=lambda: 1_767_225_600.0)
    watch.joining()
    report = watch.report()
    assert (report["joining_seconds"], report["join_overdue"]) == (8.0, False)
    report = watch.report()
    assert report["join_overdue"] is True and report["joining_seconds"] > 8.0


def test_enforce_fails_an_overdue_join_and_counts_it() -> None:
    watch = JoinWatch(0.2)
    before = metrics.JOIN_TIMEOUTS._value.get()
    watch.joining()
    started = time.monotonic()
    with pytest.raises(JoinTimeout, match=r"group join not complete after 0\.2"):
        asyncio.run(enforce(watch, max_interval=0.05))
    assert time.monotonic() - started >= 0.2
    assert metrics.JOIN_TIMEOUTS._value.get() == before + 1


def test_enforce_leaves_completed_joins_alone() -> None:
    watch = JoinWatch(0.2)

    async def joins_in_time() -> None:
        task = asyncio.get_running_loop().create_task(enforce(watch, max_interval=0.05))
        for _ in range(5):  # five joins of 0.1 s each, one after the other
            watch.joining()
            await asyncio.sleep(0.1)
            watch.joined()
        assert not task.done()
        task.cancel()

    asyncio.run(joins_in_time())


def test_stopping_the_loop_wakes_a_thread_waiting_on_it() -> None:
    io = EventLoopThread("test-loop")
    outcome: list[BaseException] = []

    def wait_forever() -> None:
        try:
            io.run(asyncio.sleep(3600), timeout=60)
        except BaseException as error:  # what woke it is the result
            outcome.append(error)

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    time.sleep(0.1)
    io.stop()
    waiter.join(5)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], concurrent.futures.CancelledError)
