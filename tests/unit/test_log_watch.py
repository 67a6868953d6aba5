"""The log check before each send and snapshot write (``checkpoint.log_watch``): which record
of each partition it checks, which check a waiter may take, and what it does when the broker
cannot tell.

A stand-in for ``LogCheck.holds`` (pure logic; the real fetches and a topic re-created
under a running worker: tests/integration/test_recreated_topic.py)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping

import pytest

from onceflow.checkpoint import log_watch
from onceflow.checkpoint.log_marks import LogMark, LogReplaced
from onceflow.checkpoint.log_watch import LogWatch
from onceflow.stages.state import TopicPartition

A, B = ("orders", 0), ("orders", 1)


class Holds:
    """``LogCheck.holds``: records what it was asked, fails as told."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.asked: list[dict[TopicPartition, LogMark]] = []
        self.failures = failures or []

    async def holds(self, marks: Mapping[TopicPartition, LogMark]) -> None:
        self.asked.append(dict(marks))
        if self.failures:
            raise self.failures.pop(0)


def mark(offset: int) -> LogMark:
    return LogMark(offset, 1000 + offset, f"d{offset}")


def watch(check: Holds, stored: Mapping[TopicPartition, LogMark]) -> LogWatch:
    logs = LogWatch()
    logs.assigned(check, [A, B], stored)
    return logs


def test_each_write_checks_the_last_durable_record_of_the_partitions_it_advances() -> None:
    check = Holds()
    logs = watch(check, {A: mark(9)})  # B has no mark in the store yet
    logs.seen({A: mark(20), B: mark(5)})  # B's first batch anchors it
    logs.seen({B: mark(8)})
    asyncio.run(logs.verify({A: mark(20), B: mark(8)}))
    assert check.asked == [{A: mark(9), B: mark(5)}]
    logs.written({A: mark(20), B: mark(8)})
    asyncio.run(logs.verify({B: mark(12)}))  # only what the snapshot advanced
    assert check.asked[-1] == {B: mark(8)}


def test_a_partition_not_assigned_is_not_anchored_by_the_store() -> None:
    logs = LogWatch()
    check = Holds()
    logs.assigned(check, [A], {A: mark(3), B: mark(4)})
    asyncio.run(logs.verify({B: mark(6)}))
    assert check.asked == []


def test_a_replaced_log_fails_the_write_and_an_unreachable_broker_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(log_watch, "RETRY_FIRST", 0.01)
    check = Holds([TimeoutError("no answer"), OSError("refused")])
    logs = watch(check, {A: mark(9)})
    asyncio.run(logs.verify({A: mark(11)}))
    assert len(check.asked) == 3 and "sends and the snapshot wait" in caplog.text
    replaced = LogReplaced(A, mark(9), "it now ends at offset 2")
    check.failures = [replaced]
    with pytest.raises(LogReplaced):
        asyncio.run(logs.verify({A: mark(11)}))
    with pytest.raises(LogReplaced):  # for good: nothing after it is let through
        asyncio.run(logs.checked([B]))
    assert len(check.asked) == 4


def test_without_a_check_nothing_is_asked() -> None:
    logs = LogWatch()
    logs.seen({A: mark(1)})
    asyncio.run(logs.verify({A: mark(2)}))  # no store, no marks topic: nothing to ask


class Gated(Holds):
    """``holds`` that answers only when the test lets it, and notes when each check began."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.began: list[float] = []

    async def holds(self, marks: Mapping[TopicPartition, LogMark]) -> None:
        self.began.append(asyncio.get_running_loop().time())
        await self.go.wait()
        await super().holds(marks)


def test_one_check_serves_all_who_wait_when_it_begins_and_none_who_came_after() -> None:
    async def scenario() -> None:
        check = Gated()
        logs = watch(check, {A: mark(9), B: mark(4)})
        first = asyncio.ensure_future(logs.checked([A]))
        second = asyncio.ensure_future(logs.checked([A]))
        await asyncio.sleep(0.01)  # the check began, holding both
        late = asyncio.ensure_future(logs.checked([B]))  # came after it began
        await asyncio.sleep(0.01)
        assert check.began and len(check.began) == 1
        check.go.set()
        await asyncio.gather(first, second)
        assert check.asked[0] == {A: mark(9)}  # what the first two named
        await late
        assert check.asked[1:] == [{B: mark(4)}]  # a check of its own, begun after it
        await logs.checked()  # none named (a tick's outputs): every anchored partition
        assert check.asked[-1] == {A: mark(9), B: mark(4)}
    asyncio.run(scenario())


def test_checks_begin_at_most_once_per_spacing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_watch, "SPACING", 0.2)

    async def scenario() -> None:
        check = Gated()
        check.go.set()
        logs = watch(check, {A: mark(9)})
        for _ in range(3):
            await logs.checked([A])
        assert len(check.began) == 3
        assert all(b - a >= 0.2 - 1e-3 for a, b in itertools.pairwise(check.began))
    asyncio.run(scenario())
