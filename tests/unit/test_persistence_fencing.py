"""Persistence under fencing: a refused snapshot writes nothing and is never durable.

The checkpoint coordinator (``coordinator.Checkpoints``) runs the numbered steps
on a real event loop and hands the write to persistence's thread. The store
here is a dict that checks guards as Redis's script does
(``persistence_doubles.DictStore``); the real script is tested against Redis in
``tests/integration/test_fencing_redis.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from persistence_doubles import DictStore

from onceflow.actors import metrics
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import StageRows
from onceflow.checkpoint.coordinator import Checkpoints, Taking
from onceflow.checkpoint.persistence import StoreWriter
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing import Fenced, Taken
from onceflow.stores.fencing.held_epochs import EpochFence

A: TopicPartition = ("t", 0)
B: TopicPartition = ("t", 1)


@pytest.fixture
def io() -> Iterator[EventLoopThread]:
    loop = EventLoopThread("test-loop")
    yield loop
    loop.stop()


def coordinator(io: EventLoopThread, store: DictStore, fence: EpochFence,
                reported: list[BaseException]) -> Checkpoints:
    writer = StoreWriter(stores={"mem": store}, stats_store=store, fence=fence)
    return Checkpoints(io, lambda who, error: reported.append(error), writer)


def take(checkpoints: Checkpoints, rows: dict[str, bytes]) -> Taking:
    """Partitions A and B assigned, a batch processed, a forced snapshot right after it."""
    checkpoints.run(lambda ledger: ledger.assigned({A: 0, B: 0}))
    taking = Taking([StageRows("per_key", "mem", rows, {})] if rows else [], {}, force=True)
    checkpoints.hand_over({A: 5, B: 3}, None, [], None, taking)
    return taking


@pytest.mark.parametrize("rows", [{"k": b"v"}, {}], ids=["rows", "no-rows"])
def test_a_snapshot_of_a_partition_taken_over_is_refused_and_never_durable(
    io: EventLoopThread, rows: dict[str, bytes],
) -> None:
    store, fence, reported = DictStore(), EpochFence(), []
    fence.assign(Taken(1, {A: None, B: None}))
    store.epochs = {A: 1, B: 2}  # another worker took B over
    before = metrics.FENCED._value.get()
    checkpoints = coordinator(io, store, fence, reported)
    try:
        with pytest.raises(Fenced, match=r"t\[1\]: this worker holds epoch 1, the store has 2"):
            take(checkpoints, rows).answer.result(timeout=5)
        assert store.rows == {}
        assert [type(error) for error in reported] == [Fenced]  # the pipeline restarts
        assert store.stats == {"fenced_writes": 1}
        assert metrics.FENCED._value.get() == before + 1
        # its offsets never became durable
        assert checkpoints.run(lambda ledger: ledger.committable()) == {}
    finally:
        checkpoints.stop()


def test_a_snapshot_of_partitions_still_held_is_written_and_durable(
    io: EventLoopThread,
) -> None:
    store, fence, reported = DictStore(), EpochFence(), []
    fence.assign(Taken(1, {A: None, B: None}))
    store.epochs = {A: 1, B: 1}
    checkpoints = coordinator(io, store, fence, reported)
    try:
        assert take(checkpoints, {"k": b"v"}).answer.result(timeout=5) == {A: 5, B: 3}
        assert store.rows == {("per_key", "k"): b"v"} and reported == []
        assert checkpoints.run(lambda ledger: ledger.committable()) == {A: 5, B: 3}
    finally:
        checkpoints.stop()
