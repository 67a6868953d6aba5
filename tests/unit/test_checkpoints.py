"""The checkpoint coordinator on a real event loop: invariant 5 in its order of steps.

A snapshot handed over right after a batch with outputs is written only once
those outputs are settled; a send that fails fails the snapshot, reports the
core failed, and nothing of it (or after it) becomes durable or committable.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import Snapshot, StageRows
from onceflow.checkpoint.coordinator import Checkpoints, Taking
from onceflow.checkpoint.log_marks import LogMark, LogReplaced
from onceflow.stages.outcome import Output
from onceflow.stages.state import TopicPartition

A: TopicPartition = ("in", 0)
OUT = [Output("out", b"k", b"v", (), None)]


class Recorder:
    """A writer that records what it was asked to write."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.wrote = threading.Event()

    def write(self, snapshot: Snapshot) -> None:
        self.written.append(snapshot.checkpoint.number)
        self.wrote.set()

    def add_stats(self, stats: Mapping[str, int]) -> None:
        pass


class Sends:
    """Sends that settle when the test says so: those pending then, and any started after
    (a hand-over's send task may first run after the test's ``settle``)."""

    def __init__(self, io: EventLoopThread) -> None:
        self.io = io
        self.pending: list[asyncio.Future[None]] = []
        self.outcome: list[BaseException | None] = []  # once settled: [the error or None]
        self.values: list[bytes] = []  # of every output sent, in order

    async def send(self, outputs: Sequence[Output],
                   depends: frozenset[TopicPartition] = frozenset()) -> None:
        self.values += [o.value for o in outputs]
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        if self.outcome:
            self._resolve(future, self.outcome[0])
        await future

    def settle(self, error: BaseException | None = None) -> None:
        def on_loop() -> None:
            self.outcome[:] = [error]
            for future in self.pending:
                self._resolve(future, error)
        self.io.call_soon(on_loop)

    @staticmethod
    def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


@pytest.fixture
def io() -> Iterator[EventLoopThread]:
    loop = EventLoopThread("test-loop")
    yield loop
    loop.stop()


def coordinator(io: EventLoopThread, reported: list[BaseException]
                ) -> tuple[Checkpoints, Recorder, Sends]:
    writer, sends = Recorder(), Sends(io)
    checkpoints = Checkpoints(io, lambda who, error: reported.append(error), writer)
    checkpoints.use_producer(sends.send)
    checkpoints.run(lambda ledger: ledger.assigned({A: 0}))
    return checkpoints, writer, sends


def test_a_snapshot_is_written_only_once_its_batch_outputs_are_settled(
    io: EventLoopThread,
) -> None:
    reported: list[BaseException] = []
    checkpoints, writer, sends = coordinator(io, reported)
    try:
        taking = Taking([StageRows("s", "mem", {"k": b"1"}, {})], {}, force=False)
        checkpoints.hand_over({A: 10}, None, OUT, None, taking)
        assert not writer.wrote.wait(0.3)  # the output is not settled: nothing written
        assert checkpoints.run(lambda ledger: ledger.committable()) == {}
        sends.settle()
        assert taking.answer.result(timeout=5) == {A: 10}
        assert writer.written == [1] and reported == []
        assert checkpoints.run(lambda ledger: ledger.committable()) == {A: 10}
    finally:
        checkpoints.stop()


def test_a_failed_send_fails_its_snapshot_and_the_next_and_nothing_is_durable(
    io: EventLoopThread,
) -> None:
    reported: list[BaseException] = []
    checkpoints, writer, sends = coordinator(io, reported)
    try:
        first = Taking([StageRows("s", "mem", {"k": b"1"}, {})], {}, force=False)
        checkpoints.hand_over({A: 10}, None, OUT, None, first)
        second = Taking([StageRows("s", "mem", {"k": b"2"}, {})], {}, force=False)
        checkpoints.hand_over({A: 20}, None, [], None, second)
        sends.settle(RuntimeError("undeliverable"))
        with pytest.raises(RuntimeError, match="undeliverable"):
            first.answer.result(timeout=5)
        with pytest.raises(Exception, match="an earlier one failed"):
            second.answer.result(timeout=5)
        assert writer.written == []
        assert reported and isinstance(reported[0], RuntimeError)  # the core restarts
        assert checkpoints.run(lambda ledger: ledger.committable()) == {}
    finally:
        checkpoints.stop()


def test_whoever_waits_for_a_snapshot_is_told_when_the_core_stops(
    io: EventLoopThread,
) -> None:
    checkpoints, writer, _ = coordinator(io, [])
    taking = Taking([StageRows("s", "mem", {"k": b"1"}, {})], {}, force=False)
    checkpoints.hand_over({A: 10}, None, OUT, None, taking)  # never settled
    checkpoints.run(lambda ledger: None)  # after the hand-over, on the loop
    assert writer.written == []
    io.stop()
    checkpoints.stop()
    with pytest.raises(Exception, match="core stopped"):
        taking.answer.result(timeout=5)


class Verdicts:
    """``LogCheck.holds``: every check waits until the test opens it, then answers the verdict
    of that moment (however many checks the loop ran meanwhile)."""

    def __init__(self) -> None:
        self.verdict: BaseException | None = None
        self.open = threading.Event()

    async def holds(self, marks: Mapping[TopicPartition, LogMark]) -> None:
        while not self.open.is_set():
            await asyncio.sleep(0.005)
        if self.verdict is not None:
            raise self.verdict


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_outputs_leave_only_after_a_check_of_their_logs_and_in_order(
    io: EventLoopThread,
) -> None:
    """A topic re-created under the worker: a batch read from the new log must not reach
    an output before the check that would find the log replaced (``log_watch``)."""
    reported: list[BaseException] = []
    checkpoints, writer, sends = coordinator(io, reported)
    check, anchor = Verdicts(), LogMark(9, 1009, "d9")
    checkpoints.run(lambda ledger: checkpoints.logs.assigned(check, [A], {A: anchor}))
    try:
        for offset in (10, 11, 12):
            out = [Output("out", b"k", str(offset).encode(), (), None)]
            checkpoints.hand_over({A: offset}, None, out, None, None)
        checkpoints.run(lambda ledger: None)
        assert not _until(lambda: bool(sends.values), timeout=0.3)  # all wait for the check
        check.open.set()
        assert _until(lambda: len(sends.values) == 3), sends.values
        assert sends.values == [b"10", b"11", b"12"] and reported == []

        check.verdict = LogReplaced(A, anchor, "its record at offset 9 differs")
        checkpoints.hand_over({A: 13}, None, OUT, None, None)
        sends.settle()
        taking = Taking([StageRows("s", "mem", {"k": b"1"}, {})], {}, force=False)
        checkpoints.take(taking)
        with pytest.raises(LogReplaced):
            taking.answer.result(timeout=5)
        assert sends.values == [b"10", b"11", b"12"]  # the batch after it: never sent
        assert writer.written == [] and reported and isinstance(reported[0], LogReplaced)
    finally:
        checkpoints.stop()
