"""EpochFence: which epochs a write may carry (stores/fencing/held_epochs, docs "Fencing")."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from onceflow.stages.state import TopicPartition
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Taken, epoch_key, first_mismatch, write_timestamp
from onceflow.stores.fencing.cassandra_fence import WriteClock
from onceflow.stores.fencing.held_epochs import EpochFence, Fencing, epoch_source, share_epochs

A: TopicPartition = ("orders", 0)
B: TopicPartition = ("orders", 1)


def taken(epoch: int, previous: dict[TopicPartition, int | None]) -> Taken:
    return Taken(epoch, previous)


def test_a_write_carries_the_epochs_of_what_it_depends_on() -> None:
    fence = EpochFence()
    assert fence.assign(taken(7, {A: None, B: 3})) == set()  # never held here: nothing moved
    assert fence.expect({A}) == {A: 7}
    assert fence.expect({A, B}) == {A: 7, B: 7}
    assert fence.expect(set()) == {}
    assert fence.held() == {A: 7, B: 7}


def test_a_partition_not_assigned_any_more_refuses_every_write_depending_on_it() -> None:
    fence = EpochFence()
    fence.assign(taken(1, {A: None, B: None}))
    fence.assign(taken(2, {A: 1}))  # B went to another worker
    with pytest.raises(Fenced) as refused:
        fence.expect({A, B})
    assert refused.value.partition == B and refused.value.held is None
    assert "holds no epoch" in str(refused.value)
    assert fence.expect({A}) == {A: 2}
    assert fence.held() == {A: 2}


def test_a_partition_taken_by_another_worker_meanwhile_is_kept_back_until_forgotten() -> None:
    fence = EpochFence()
    fence.assign(taken(3, {A: None, B: None}))
    # Epoch 9: A was still at 3 (nobody else held it, however many epochs others took);
    # B was at 5: another worker took it meanwhile.
    assert fence.assign(taken(9, {A: 3, B: 5})) == {B}
    assert fence.expect({A}) == {A: 9}
    with pytest.raises(Fenced):
        fence.expect({B})  # what is in memory of B may be older than the store
    assert B not in fence.held()
    fence.release({B})
    assert fence.expect({A, B}) == {A: 9, B: 9}
    fence.release({B})  # idempotent
    assert fence.held() == {A: 9, B: 9}


def test_moved_compares_with_the_last_epoch_taken_here_not_the_last_held() -> None:
    fence = EpochFence()
    fence.assign(taken(4, {A: None}))
    fence.assign(taken(6, {B: None}))  # A went elsewhere...
    assert fence.assign(taken(8, {A: 4, B: 6})) == set()  # ...but nobody took it
    assert fence.assign(taken(10, {A: 8, B: None})) == {B}  # B's epoch vanished: moved


def test_a_revoked_partition_leaves_the_outbox_guard() -> None:
    fence = EpochFence()
    fence.assign(taken(1, {A: None, B: None}))
    fence.drop({B})  # flushed and forgotten: its next owner may take its epoch now
    assert fence.held() == {A: 1}
    assert fence.assign(taken(2, {A: 1, B: 1})) == set()  # back, nobody took it: not moved


def test_losing_the_store_drops_every_epoch() -> None:
    fence = EpochFence()
    fence.assign(taken(1, {A: None}))
    fence.assign(Taken(0, {}))
    with pytest.raises(Fenced):
        fence.expect({A})


def test_a_successors_write_timestamp_is_above_every_zombie_write() -> None:
    assert write_timestamp(0, 0) == 2**52  # above the driver's clock (~1.7e15 us)
    assert write_timestamp(0, 0) > 1_800_000_000 * 10**6
    assert write_timestamp(3, 5) == 2**52 + 3 * 2**32 + 5
    assert write_timestamp(3, 2**32 - 1) < write_timestamp(4, 0)  # epoch first, then n
    assert write_timestamp(2**31 - 2**20 - 1, 2**32 - 1) < 2**63  # a CQL bigint
    with pytest.raises(ValueError):
        write_timestamp(3, 2**32)
    with pytest.raises(ValueError):
        write_timestamp(2**31 - 2**20, 0)


def test_a_write_clock_orders_by_the_guards_epoch_then_by_write() -> None:
    clock = WriteClock()
    assert clock.next(None) == write_timestamp(0, 1)  # nothing seen yet
    assert clock.next({A: 5, B: 5}) == write_timestamp(5, 2)
    assert clock.next({}) == write_timestamp(5, 3)  # no guard: the highest epoch seen
    clock.saw(7)  # a take
    assert clock.next(None) == write_timestamp(7, 4)
    assert clock.next({A: 6}) == write_timestamp(6, 5)  # a guard's own epoch, even if lower


def test_the_first_differing_epoch_names_the_partition_and_both_epochs() -> None:
    assert first_mismatch({A: 2, B: 5}, {A: 2, B: 5}) is None
    refused = first_mismatch({A: 2, B: 5}, {A: 3, B: 6})
    assert refused is not None
    assert (refused.partition, refused.held, refused.stored) == (A, 2, 3)
    assert "holds epoch 2, the store has 3" in str(refused)
    missing = first_mismatch({B: 1}, {})
    assert missing is not None and missing.stored is None
    assert epoch_key("onceflow:p", ("a|b", 3)) == "onceflow:p:epoch:a|b|3"


def test_the_worker_names_the_outbox_it_cannot_fence(tmp_path: Path) -> None:
    from onceflow.runtime.config import load_settings
    from onceflow.runtime.wiring import unfenced_stores
    from onceflow.stages.pipeline import Pipeline

    def pipeline(*stores: str) -> Pipeline:
        built = Pipeline("p", topics=("t",))
        for i, store in enumerate(stores):
            built = built.aggregate(f"a{i}", key=str, init=int, fold=lambda n, _: n + 1,
                                    store=store)
        return built

    def unfenced(outbox: str, *stores: str) -> list[str]:
        conf = tmp_path / "app.conf"
        conf.write_text("onceflow.pipeline = \"m:p\"\n")
        settings = load_settings(conf, {"onceflow.kafka.producer.outbox-store": outbox})
        return unfenced_stores(settings, pipeline(*stores))

    assert unfenced("auto", "redis") == []
    assert unfenced("auto", "cassandra") == []  # fenced too now
    assert unfenced("auto", "redis", "cassandra") == []  # epochs and outbox in Redis
    assert unfenced("auto", "cassandra", "redis") == ["the cassandra outbox"]
    assert unfenced("redis", "cassandra") == ["the redis outbox"]
    assert unfenced("none", "cassandra", "redis") == []
    assert unfenced("auto") == []  # a stateless republisher takes no epochs


class FakeStore:
    """What epoch_source, share_epochs and Fencing use of a store: a counter here."""

    def __init__(self, fenced: bool = True, atomic: bool = False, counter: int = 0) -> None:
        self.fenced, self.atomic_fence, self.counter = fenced, atomic, counter
        self.elsewhere = False
        self.epochs: dict[TopicPartition, int] = {}

    def epochs_elsewhere(self) -> None:
        self.elsewhere = True

    def raise_counter(self, epoch: int) -> int:
        before, self.counter = self.counter, max(self.counter, epoch)
        return before

    def take_epochs(self, partitions: list[TopicPartition], floor: int = 0) -> Taken:
        self.counter = max(self.counter, floor) + 1
        previous = {tp: self.epochs.get(tp) for tp in partitions}
        self.epochs.update(dict.fromkeys(partitions, self.counter))
        return Taken(self.counter, previous)


class OtherKind(FakeStore):
    pass


def test_one_store_keeps_the_epochs_redis_first_and_the_others_are_told() -> None:
    plain, redis, cassandra = FakeStore(False), FakeStore(atomic=True), OtherKind()
    stores = cast(list[StateStore], [plain, cassandra, redis])
    assert epoch_source(stores) is redis  # atomic check preferred, whatever the order
    assert epoch_source(cast(list[StateStore], [plain, cassandra])) is cassandra
    assert epoch_source(cast(list[StateStore], [plain])) is None
    assert share_epochs(cast(StateStore, redis), [*stores, None]) == (cassandra,)
    assert cassandra.elsewhere and not redis.elsewhere and not plain.elsewhere
    assert share_epochs(None, stores) == ()


def test_a_take_starts_above_the_other_stores_counters_and_raises_them() -> None:
    source, other = FakeStore(atomic=True), OtherKind(counter=41)
    fencing = Fencing(cast(StateStore, source), others=(cast(StateStore, other),))
    fencing.take([A])
    assert fencing.fence.held() == {A: 42} and other.counter == 42
    fencing.take([A])
    assert fencing.fence.held() == {A: 43} and other.counter == 43
