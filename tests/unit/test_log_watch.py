"""The log check before each snapshot write (``checkpoint.log_watch``): which record of each
partition it checks, and what it does when the broker cannot tell.

A stand-in for ``LogCheck.holds`` (pure logic; the real fetches and a topic re-created
under a running worker: tests/integration/test_recreated_topic.py)."""

from __future__ import annotations

import asyncio
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
    logs.assigned(check, [A, B], stored)  # type: ignore[arg-type]
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
    logs.assigned(check, [A], {A: mark(3), B: mark(4)})  # type: ignore[arg-type]
    asyncio.run(logs.verify({B: mark(6)}))
    assert check.asked == []


def test_a_replaced_log_fails_the_write_and_an_unreachable_broker_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(log_watch, "RETRY_FIRST", 0.01)
    check = Holds([TimeoutError("no answer"), OSError("refused")])
    logs = watch(check, {A: mark(9)})
    asyncio.run(logs.verify({A: mark(11)}))
    assert len(check.asked) == 3 and "the snapshot waits" in caplog.text
    replaced = LogReplaced(A, mark(9), "it now ends at offset 2")
    check.failures = [replaced]
    with pytest.raises(LogReplaced):
        asyncio.run(logs.verify({A: mark(11)}))


def test_without_a_check_nothing_is_asked() -> None:
    logs = LogWatch()
    logs.seen({A: mark(1)})
    asyncio.run(logs.verify({A: mark(2)}))  # no store, no marks topic: nothing to ask
