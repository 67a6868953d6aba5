"""PersistenceActor under fencing: a refused snapshot writes nothing and is never durable.

The store here is a dict that checks guards as Redis's script does
(``persistence_doubles.DictStore``); the real script is tested against Redis in
``tests/integration/test_fencing_redis.py``.
"""

from __future__ import annotations

import pykka
import pytest
from persistence_doubles import DictStore

from onceflow.actors import metrics
from onceflow.actors.fence import EpochFence
from onceflow.actors.ledger import SharedLedger
from onceflow.actors.messages import Snapshot, StageRows
from onceflow.actors.persistence import PersistenceActor
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing import Fenced, Taken

A: TopicPartition = ("t", 0)
B: TopicPartition = ("t", 1)


def snapshot_of(ledger: SharedLedger, rows: dict[str, bytes]) -> Snapshot:
    with ledger() as ready:
        ready.assigned({A: 0, B: 0})
        ready.processed({A: 5, B: 3}, sent=False)
        checkpoint = ready.take(dirty=bool(rows), force=True)
    assert checkpoint is not None and checkpoint.depends == {A, B}
    return Snapshot([StageRows("per_key", "mem", rows, {})] if rows else [], checkpoint)


def persistence(store: DictStore, ledger: SharedLedger, fence: EpochFence,
                reported: list[BaseException]
                ) -> pykka.ActorRef[PersistenceActor]:
    return PersistenceActor.start(stores={"mem": store}, ledger=ledger,
                                  stats_store=store, fence=fence,
                                  on_fatal=lambda who, error: reported.append(error))


@pytest.mark.parametrize("rows", [{"k": b"v"}, {}], ids=["rows", "no-rows"])
def test_a_snapshot_of_a_partition_taken_over_is_refused_and_never_durable(
    rows: dict[str, bytes],
) -> None:
    store, ledger, fence, reported = DictStore(), SharedLedger(), EpochFence(), []
    fence.assign(Taken(1, {A: None, B: None}))
    store.epochs = {A: 1, B: 2}  # another worker took B over
    before = metrics.FENCED._value.get()
    ref = persistence(store, ledger, fence, reported)
    try:
        with pytest.raises(Fenced, match=r"t\[1\]: this worker holds epoch 1, the store has 2"):
            ref.ask(snapshot_of(ledger, rows), timeout=5)
    finally:
        ref.stop()
    assert store.rows == {}
    assert [type(error) for error in reported] == [Fenced]  # the pipeline restarts
    assert store.stats == {"fenced_writes": 1}
    assert metrics.FENCED._value.get() == before + 1
    with ledger() as after:
        assert after.committable() == {}  # its offsets never became durable


def test_a_snapshot_of_partitions_still_held_is_written_and_durable(
) -> None:
    store, ledger, fence, reported = DictStore(), SharedLedger(), EpochFence(), []
    fence.assign(Taken(1, {A: None, B: None}))
    store.epochs = {A: 1, B: 1}
    ref = persistence(store, ledger, fence, reported)
    try:
        assert ref.ask(snapshot_of(ledger, {"k": b"v"}), timeout=5) == {A: 5, B: 3}
    finally:
        ref.stop()
    assert store.rows == {("per_key", "k"): b"v"} and reported == []
    with ledger() as after:
        assert after.committable() == {A: 5, B: 3}
