"""EpochFence: which epochs a write may carry (onceflow.actors.fence, docs "Fencing")."""

from __future__ import annotations

import pytest

from onceflow.actors.fence import EpochFence
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing import Fenced, epoch_key, first_mismatch

A: TopicPartition = ("orders", 0)
B: TopicPartition = ("orders", 1)


def test_a_write_carries_the_epochs_of_what_it_depends_on() -> None:
    fence = EpochFence()
    assert fence.assign({A: 1, B: 7}) == set()  # never held here: nothing moved
    assert fence.expect({A}) == {A: 1}
    assert fence.expect({A, B}) == {A: 1, B: 7}
    assert fence.expect(set()) == {}
    assert fence.held() == {A: 1, B: 7}


def test_a_partition_not_assigned_any_more_refuses_every_write_depending_on_it() -> None:
    fence = EpochFence()
    fence.assign({A: 1, B: 1})
    fence.assign({A: 2})  # B went to another worker
    with pytest.raises(Fenced) as refused:
        fence.expect({A, B})
    assert refused.value.partition == B and refused.value.held is None
    assert "holds no epoch" in str(refused.value)
    assert fence.expect({A}) == {A: 2}
    assert fence.held() == {A: 2}


def test_an_epoch_that_jumped_is_kept_back_until_the_old_progress_is_forgotten() -> None:
    fence = EpochFence()
    fence.assign({A: 3, B: 3})
    # A came back at 4 (nobody else held it); B at 6: others took 4 and 5 meanwhile.
    assert fence.assign({A: 4, B: 6}) == {B}
    assert fence.expect({A}) == {A: 4}
    with pytest.raises(Fenced):
        fence.expect({B})  # what is in memory of B may be older than the store
    assert B not in fence.held()
    fence.release({B})
    assert fence.expect({A, B}) == {A: 4, B: 6}
    fence.release({B})  # idempotent
    assert fence.held() == {A: 4, B: 6}


def test_a_revoked_partition_leaves_the_outbox_guard() -> None:
    fence = EpochFence()
    fence.assign({A: 1, B: 1})
    fence.drop({B})  # flushed and forgotten: its next owner may take its epoch now
    assert fence.held() == {A: 1}
    assert fence.assign({A: 2, B: 2}) == set()  # back with the next epoch: not moved


def test_losing_the_store_drops_every_epoch() -> None:
    fence = EpochFence()
    fence.assign({A: 1})
    fence.assign({})
    with pytest.raises(Fenced):
        fence.expect({A})


def test_the_first_differing_epoch_names_the_partition_and_both_epochs() -> None:
    assert first_mismatch({A: 2, B: 5}, {A: 2, B: 5}) is None
    refused = first_mismatch({A: 2, B: 5}, {A: 3, B: 6})
    assert refused is not None
    assert (refused.partition, refused.held, refused.stored) == (A, 2, 3)
    assert "holds epoch 2, the store has 3" in str(refused)
    missing = first_mismatch({B: 1}, {})
    assert missing is not None and missing.stored is None
    assert epoch_key("onceflow:p", ("a|b", 3)) == "onceflow:p:epoch:a|b|3"


def test_the_worker_names_the_stores_it_cannot_fence() -> None:
    from onceflow.runtime.wiring import unfenced_stores
    from onceflow.stages.pipeline import Pipeline

    def pipeline(*stores: str) -> Pipeline:
        built = Pipeline("p", topics=("t",))
        for i, store in enumerate(stores):
            built = built.aggregate(f"a{i}", key=str, init=int, fold=lambda n, _: n + 1,
                                    store=store)
        return built

    assert unfenced_stores(pipeline("redis")) == []
    assert unfenced_stores(pipeline("redis", "cassandra")) == ["cassandra"]
    assert unfenced_stores(pipeline("cassandra")) == ["cassandra"]
    assert unfenced_stores(pipeline()) == []  # a stateless republisher writes no states
