"""``chain_origin`` (the runner's one call per record with a source chain) agrees with
``root_of`` and ``route_of``, the definitions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.lineage import chain_origin, root_of, route_of

HOPS = st.lists(st.tuples(st.sampled_from(["raw", "norm", "by-key"]), st.integers(0, 7),
                          st.integers(0, 10**12), st.integers(0, 5)), max_size=4)


@given(hops=HOPS, partition=st.integers(0, 7), offset=st.integers(0, 10**12))
def test_origin_is_root_route_and_position(hops: list[tuple[str, int, int, int]],
                                           partition: int, offset: int) -> None:
    envelope = Envelope()
    for topic, p, o, index in hops:
        envelope.source_chain.add(topic=topic, partition=p, offset=o, index=index)
    if not hops:  # no chain: the record is its own root and route (the runner's raw case)
        assert root_of(envelope, "in", partition, offset) == (("in", partition), (offset,))
        assert route_of(envelope, "in", partition) == ("in", partition)
        return
    root, position = root_of(envelope, "in", partition, offset)
    assert chain_origin(envelope.source_chain) == (
        root, route_of(envelope, "in", partition), position)
    if len(hops) == 1:
        topic, p, o, index = hops[0]
        assert chain_origin(envelope.source_chain) == ((topic, p), (topic, p), (o, index))
