"""The producer's remembered key hashes place every keyed record where Kafka's partitioner does."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from onceflow.actors.producer import key_hash, key_partition

KAFKA = DefaultPartitioner()


@given(keys=st.lists(st.binary(max_size=40), min_size=1, max_size=50),
       count=st.integers(min_value=1, max_value=64))
def test_key_partition_is_kafkas_default_partitioner(keys: list[bytes], count: int) -> None:
    partitions = list(range(count))
    for key in keys * 2:  # the second time from the remembered hashes
        assert key_partition(key, partitions) == KAFKA(key, partitions, partitions)


def test_remembered_hashes_are_bounded() -> None:
    for n in range(20_000):
        key_hash(n.to_bytes(4, "big"))
    assert key_hash.cache_info().currsize <= 16_384
