"""Fenced writes on a real Cassandra 2.1: epochs, refusals, and rows ordered by epoch.

Two clients of the same pipeline stand for two workers: ``old`` took the
partitions' epochs first, ``new`` took them over. A late write of ``old`` is
refused by the check before it; one that passed its check before ``new`` took
over still lands after ``new``'s write, and loses to it (write timestamps).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from cassandra import WriteTimeout
from cassandra.cluster import Cluster
from helpers import assert_history_and_outbox_fenced

from onceflow.devtools.services import ServiceInfo
from onceflow.stores.cassandra_store import CassandraStore, CassandraUnavailable
from onceflow.stores.fencing import Fenced, Guard, Taken
from onceflow.stores.fencing.held_epochs import Fencing
from onceflow.stores.redis_store import RedisStore
from onceflow.stores.retry import retrying

A, B = ("orders", 0), ("orders", 1)


@pytest.fixture
def keyspace(unique_name: Callable[..., str]) -> str:
    return unique_name("ks")


@pytest.fixture
def pair(cassandra_service: ServiceInfo, keyspace: str, unique_name: Callable[..., str]
         ) -> Iterator[tuple[CassandraStore, CassandraStore]]:
    pipeline = unique_name("p")
    old, new = (CassandraStore([cassandra_service.host], pipeline, port=cassandra_service.port,
                               keyspace=keyspace, protocol_version=3) for _ in range(2))
    yield old, new
    old.close()
    new.close()


def test_each_take_is_one_new_epoch_of_the_pipeline_answering_the_previous_ones(
    pair: tuple[CassandraStore, CassandraStore],
) -> None:
    old, new = pair
    assert old.fenced
    assert old.take_epochs([A, B]) == Taken(1, {A: None, B: None})
    assert new.take_epochs([A]) == Taken(2, {A: 1})
    assert old.take_epochs([B, A]) == Taken(3, {A: 2, B: 1})
    assert old.take_epochs([]) == Taken(0, {})


def test_concurrent_takes_never_answer_the_same_epoch_and_each_replaces_the_one_before(
    pair: tuple[CassandraStore, CassandraStore],
) -> None:
    """Taken as the worker takes (retried with backoff): contended Paxos rounds on a
    busy machine time out. A timed-out batch that was applied leaves its epoch held by
    nobody; every other epoch is answered exactly once."""
    old, new = pair
    for store in pair:  # the schema first: concurrent CREATE TABLEs can disagree
        assert store.check_access() is None
    takes: list[Taken] = []
    write_timeouts = 0
    lock = threading.Lock()

    def take_once(store: CassandraStore) -> Taken:
        nonlocal write_timeouts
        try:
            return store.take_epochs([A, B])
        except CassandraUnavailable as error:
            if isinstance(error.__cause__, WriteTimeout):
                with lock:
                    write_timeouts += 1
            raise

    def take(store: CassandraStore) -> None:
        for _ in range(8):
            taken = retrying("take epochs", lambda: take_once(store), give_up_after=60.0)
            with lock:
                takes.append(taken)

    threads = [threading.Thread(target=take, args=(store,)) for store in (old, new, old, new)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(takes) == 32
    epochs = sorted(taken.epoch for taken in takes)
    assert len(set(epochs)) == 32  # never the same epoch twice
    # Atomic: each take replaced, in both rows, the epoch applied just before it.
    for taken in takes:
        before = taken.epoch - 1 or None
        assert taken.previous == {A: before, B: before}
    assert epochs[-1] - 32 <= write_timeouts  # only a timed-out take leaves an epoch unheld


def test_a_zombie_write_after_the_takeover_is_refused_and_the_row_is_the_new_one(
    pair: tuple[CassandraStore, CassandraStore],
) -> None:
    old, new = pair
    held = old.take_epochs([A, B]).guard
    old.save("s", {"k1": b"old-1"}, guard=held)  # still the owner: written
    mine = new.take_epochs([B]).guard  # B moves to the new owner
    new.save("s", {"k1": b"new-1"}, guard=mine)
    with pytest.raises(Fenced) as refused:
        old.save("s", {"k1": b"stale", "k2": b"stale"}, guard=held)
    assert (refused.value.partition, refused.value.held, refused.value.stored) == (B, 1, 2)
    assert old.load("s", ["k1", "k2"]) == {"k1": b"new-1"}  # nothing of it written
    assert_history_and_outbox_fenced(old, held)
    with pytest.raises(Fenced):
        old.check_epochs(held)
    old.save("s", {"k3": b"a-only"}, guard={A: held[A]})  # A did not move: passes
    assert old.load("s", ["k3"]) == {"k3": b"a-only"}


@pytest.mark.parametrize("retention", [0.0, 60.0], ids=["states", "expiring"])
def test_a_zombie_write_that_passed_its_check_before_the_takeover_loses_to_the_new_row(
    pair: tuple[CassandraStore, CassandraStore], retention: float,
) -> None:
    old, new = pair
    held = old.take_epochs([A]).guard
    old.save("s", {"k": b"old-1"}, guard=held)
    check = old.check_epochs

    def check_then_lose_the_partition(guard: Guard) -> None:
        check(guard)  # passes: old still owns A
        old.check_epochs = check  # type: ignore[method-assign]
        # ...then old pauses; new takes A over and writes before old's write lands.
        new.save("s", {"k": b"new"}, guard=new.take_epochs([A]).guard)

    old.check_epochs = check_then_lose_the_partition  # type: ignore[method-assign]
    rows = {"k": b"stale", "fresh": b"stale"}
    if retention:
        old.save_expiring("s", rows, retention, guard=held)  # lands last
    else:
        old.save("s", rows, guard=held)  # lands last
    assert old.check_epochs is check  # the takeover did happen in between
    # "k" stays new's; "fresh" is written (nobody wrote it under a newer epoch).
    assert new.load("s", ["k", "fresh"]) == {"k": b"new", "fresh": b"stale"}


def test_rows_written_before_fencing_are_replaced_and_a_write_without_guard_keeps_the_epoch(
    pair: tuple[CassandraStore, CassandraStore], cassandra_service: ServiceInfo, keyspace: str,
) -> None:
    old, new = pair
    new.take_epochs([A])  # creates the schema too
    cluster = Cluster([cassandra_service.host], port=cassandra_service.port, protocol_version=3)
    try:  # a row written with the driver's clock, as before fencing
        cluster.connect().execute(
            f'INSERT INTO "{keyspace}".states (pipeline, stage, key, value) VALUES (%s, %s, %s, '
            "%s)", (new._pipeline, "s", "k", b"unfenced"))
    finally:
        cluster.shutdown()
    mine = new.take_epochs([A]).guard
    new.save("s", {"k": b"fenced"}, guard=mine)
    assert new.load("s", ["k"]) == {"k": b"fenced"}
    new.save("s", {"k": b"no guard"})  # under the highest epoch this client has seen
    assert new.load("s", ["k"]) == {"k": b"no guard"}
    old.save("s", {"k": b"zombie, no guard"})  # it saw no epoch: below every fenced row
    assert new.load("s", ["k"]) == {"k": b"no guard"}


def test_epochs_kept_elsewhere_order_the_rows_without_a_check_here(
    pair: tuple[CassandraStore, CassandraStore],
) -> None:
    old, new = pair
    old.epochs_elsewhere()
    new.epochs_elsewhere()  # the pipeline's epochs are in Redis: none in this store
    new.save("s", {"k": b"new"}, guard={A: 9})
    new.check_epochs({A: 9})  # nothing to check here
    old.save("s", {"k": b"stale"}, guard={A: 8})
    assert old.load("s", ["k"]) == {"k": b"new"}


def test_epochs_keep_growing_when_the_pipeline_moves_between_cassandra_only_and_mixed(
    pair: tuple[CassandraStore, CassandraStore], redis_service: ServiceInfo,
    unique_name: Callable[..., str],
) -> None:
    cassandra, _ = pair
    for _ in range(5):  # Cassandra-only for a while: its epochs reach 5
        Fencing(cassandra).take([A])
    cassandra.save("s", {"k": b"cassandra-only"}, guard={A: 5})
    redis_store = RedisStore(f"redis://{redis_service.address}/0", unique_name("ns"), "p")
    try:  # a Redis stage joins: Redis keeps the epochs now, above Cassandra's
        (mixed := Fencing(redis_store, others=(cassandra,))).take([A])
        held = mixed.fence.held()
        assert held == {A: 6}
        cassandra.epochs_elsewhere()
        cassandra.save("s", {"k": b"mixed"}, guard=held)
        assert cassandra.load("s", ["k"]) == {"k": b"mixed"}  # not below the old row
        for _ in range(3):
            mixed.take([A])
        assert mixed.fence.held() == {A: 9}
    finally:
        redis_store.close()
    # The Redis stage goes again: Cassandra's counter followed, so its epochs go on above.
    alone = Fencing(pair[1])
    alone.take([A])
    assert alone.fence.held() == {A: 10}
