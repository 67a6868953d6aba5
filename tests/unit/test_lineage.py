"""``origin_of`` (the runner's one call per record) agrees with ``root_of`` and ``route_of``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.lineage import origin_of, root_of, route_of

HOPS = st.lists(st.tuples(st.sampled_from(["raw", "norm", "by-key"]), st.integers(0, 7),
                          st.integers(0, 10**12), st.integers(0, 5)), max_size=4)


@given(hops=HOPS, partition=st.integers(0, 7), offset=st.integers(0, 10**12))
def test_origin_is_root_route_and_position(hops: list[tuple[str, int, int, int]],
                                           partition: int, offset: int) -> None:
    envelope = Envelope()
    for topic, p, o, index in hops:
        envelope.source_chain.add(topic=topic, partition=p, offset=o, index=index)
    for consumed in (envelope, None):
        root, position = root_of(consumed, "in", partition, offset)
        assert origin_of(consumed, "in", partition, offset) == (
            root, route_of(consumed, "in", partition), position)
    if len(hops) == 1:
        topic, p, o, index = hops[0]
        assert origin_of(envelope, "in", partition, offset) == ((topic, p), (topic, p), (o, index))
