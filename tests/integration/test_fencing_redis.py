"""Fenced writes on a real Redis: epochs, and writes refused whole once an epoch moved.

Two clients of the same pipeline stand for two workers: ``old`` took the
partitions' epochs first, ``new`` took them over (the next epochs). Every kind
of guarded write (states, expiring history rows, outbox rows) of ``old`` is
then refused with ``Fenced`` and leaves the store as it was; ``new``'s pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from helpers import assert_history_and_outbox_fenced

from onceflow.devtools.services import ServiceInfo
from onceflow.stores.fencing import Fenced, Taken, epoch_key
from onceflow.stores.redis_store import RedisStore

A, B = ("orders", 0), ("orders", 1)


@pytest.fixture
def pair(redis_service: ServiceInfo, unique_name: Callable[..., str]
         ) -> Iterator[tuple[RedisStore, RedisStore]]:
    prefix, pipeline = unique_name("ns"), unique_name("p")
    url = f"redis://{redis_service.address}/0"
    old, new = RedisStore(url, prefix, pipeline), RedisStore(url, prefix, pipeline)
    yield old, new
    old.close()
    new.close()


def test_each_take_is_one_new_epoch_of_the_pipeline_answering_the_previous_ones(
    pair: tuple[RedisStore, RedisStore], redis_service: ServiceInfo,
    unique_name: Callable[..., str],
) -> None:
    old, new = pair
    assert old.take_epochs([A, B]) == Taken(1, {A: None, B: None})
    assert new.take_epochs([A]) == Taken(2, {A: 1})
    assert old.take_epochs([B, A]) == Taken(3, {A: 2, B: 1})
    other = RedisStore(f"redis://{redis_service.address}/0", unique_name("ns"), "p")
    try:
        assert other.take_epochs([A]) == Taken(1, {A: None})  # another namespace: its own
    finally:
        other.close()
    assert old.take_epochs([]) == Taken(0, {})


def test_epochs_of_the_per_partition_scheme_only_grow(
    pair: tuple[RedisStore, RedisStore], redis_service: ServiceInfo,
) -> None:
    old, _ = pair
    client = redis.Redis.from_url(f"redis://{redis_service.address}/0")
    try:  # an epoch INCRed per partition by an earlier version, above the counter
        client.set(epoch_key(old._base, B), 41)
    finally:
        client.close()
    assert old.take_epochs([A, B]) == Taken(42, {A: None, B: 41})
    assert old.take_epochs([A]) == Taken(43, {A: 42})


def test_a_write_under_a_moved_epoch_is_refused_whole(pair: tuple[RedisStore, RedisStore]
                                                      ) -> None:
    old, new = pair
    held = old.take_epochs([A, B]).guard
    old.save("s", {"k1": b"old-1"}, guard=held)  # still the owner: written
    taken = new.take_epochs([B]).guard  # B moves to the new owner
    new.save("s", {"k1": b"new-1"}, guard={B: taken[B]})
    with pytest.raises(Fenced) as refused:
        old.save("s", {"k1": b"stale", "k2": b"stale"}, guard=held)
    assert (refused.value.partition, refused.value.held, refused.value.stored) == (B, 1, 2)
    assert old.load("s", ["k1", "k2"]) == {"k1": b"new-1"}  # nothing of it written
    # A write that depends on A only still passes: A did not move.
    old.save("s", {"k3": b"a-only"}, guard={A: held[A]})
    assert old.load("s", ["k3"]) == {"k3": b"a-only"}


def test_history_rows_and_outbox_rows_are_fenced_too(pair: tuple[RedisStore, RedisStore]
                                                     ) -> None:
    old, new = pair
    held = old.take_epochs([A]).guard
    new.take_epochs([A])
    assert_history_and_outbox_fenced(old, held)
    mine = new.take_epochs([A]).guard
    new.history_retention = 60.0
    new.save_history("s", {("k", 0): b"w"}, guard=mine)
    new.outbox_append({("out|0", 7): b"r", ("out|0", 8): b"s"}, guard=mine)
    assert list(new.scan_history("s")) == [("k", 0, b"w")]
    assert new.outbox_load() == {"out|0": [(7, b"r"), (8, b"s")]}


def test_a_guarded_write_of_many_rows_goes_out_in_chunks(pair: tuple[RedisStore, RedisStore]
                                                         ) -> None:
    old, _ = pair
    held = old.take_epochs([A, B]).guard
    rows = {f"k{i}": f"v{i}".encode() for i in range(5_003)}  # beyond Lua's unpack limit
    old.save("s", rows, guard=held)
    assert dict(old.scan("s")) == rows
    outbox = {("out|1", i): b"x" for i in range(2_501)}
    old.outbox_append(outbox, guard=held)
    assert len(old.outbox_load()["out|1"]) == 2_501


def test_checking_the_epochs_alone_writes_nothing(pair: tuple[RedisStore, RedisStore]) -> None:
    old, new = pair
    held = old.take_epochs([A]).guard
    old.check_epochs(held)
    new.take_epochs([A])
    with pytest.raises(Fenced):
        old.check_epochs(held)
