"""``unit_wire`` writes unit envelopes byte for byte as protobuf serializes them, reads
envelopes as protobuf parses them, and leaves to protobuf every value or record it does
not write or read."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runner import Rec

from onceflow.protos.envelope_pb2 import Envelope, Item, SourceRef
from onceflow.stages import Pipeline
from onceflow.stages.formats import FormatError
from onceflow.stages.heads import Heads
from onceflow.stages.outcome import StageFailure
from onceflow.stages.republish import _built_unit, _built_value
from onceflow.stages.unit_wire import read_envelope, unit_envelope, value_envelope, varint

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
#: Edges of each varint length, and signs.
EDGES = st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 2**31 - 1, -1, -(2**31), 2**49 - 1,
                         2**49, 2**56, 2**63 - 1, -(2**63)])
REFS = st.lists(st.tuples(st.text(max_size=12), INT32, INT64 | EDGES, INT32), max_size=3)
ITEMS = st.lists(st.tuples(INT32, st.binary(max_size=300), INT64 | EDGES, st.text(max_size=20)),
                 max_size=6)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=20), st.text(max_size=20), REFS, ITEMS)
def test_a_unit_is_written_as_protobuf_serializes_it(
        key: str, payload_type: str, chain: list[Any], items: list[Any]) -> None:
    expected = _built_unit(key, payload_type, chain, items).SerializeToString()
    written = unit_envelope(key, payload_type, chain, items)
    assert written == expected
    assert Envelope.FromString(written) == Envelope.FromString(expected)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=20), INT64 | EDGES, st.text(max_size=20), st.binary(max_size=300),
       st.text(max_size=20), REFS)
def test_a_value_is_written_as_protobuf_serializes_it(
        event_id: str, time_ms: int, key: str, payload: bytes, payload_type: str,
        chain: list[Any]) -> None:
    expected = _built_value(event_id, time_ms, key, payload, payload_type,
                            chain).SerializeToString()
    assert value_envelope(event_id, time_ms, key, payload, payload_type, chain) == expected


@given(st.integers(0, 2**64 - 1))
def test_varints_read_back(value: int) -> None:
    """protobuf reads each back (as an int64 field: the upper half as negatives)."""
    read = Envelope.FromString(b"\x10" + varint(value)).event_time_ms
    assert read == (value if value < 2**63 else value - 2**64)


@pytest.mark.parametrize("value", sorted({edge for bits in range(7, 64, 7)
                                            for edge in (2**bits - 1, 2**bits, 2**bits + 1)
                                            if edge < 2**63} | {2**63 - 1}))
def test_each_varint_length_is_written_as_protobuf_writes_it(value: int) -> None:
    """Every length's edges, across the writer's switch from one packed int to a byte
    at a time (seven bytes to eight)."""
    assert b"\x10" + varint(value) == Envelope(event_time_ms=value).SerializeToString()
    assert b"\x10" + varint(2**64 - value) == Envelope(
        event_time_ms=-value).SerializeToString()


class Stamp(int):
    """An int subclass (as numpy's ints are not): protobuf's to take."""


@pytest.mark.parametrize("key, item", [
    (7, (0, b"p", 1, "id")),  # a key that is no str
    ("k", (0, "p", 1, "id")),  # a payload that is no bytes
    ("k", (0, b"p", 1.5, "id")),  # an event time that is no int
    ("k", (0, b"p", True, "id")),  # a bool is an int to Python, not to this module
    ("k", (0, b"p", Stamp(5), "id")),
    ("k", (0, b"p", 2**63, "id")),  # outside int64
    ("k", (0, b"p", 1, None)),  # an event id that is no str
    ("k\udc80", (0, b"p", 1, "id")),  # text UTF-8 cannot encode
    ("k", (0, b"p", 1, "\udc80")),
])
def test_what_it_does_not_write_is_left_to_protobuf(key: Any, item: Any) -> None:
    assert unit_envelope(key, "t", [("raw", 0, 1, 0)], [(0, b"ok", 1, "a"), item]) is None
    assert unit_envelope("k", None, [("raw", 0, 1, 0)], [(0, b"ok", 1, "a")]) is None
    _, payload, time_ms, event_id = item
    assert value_envelope(event_id, time_ms, key, payload, "t", [("raw", 0, 1, 0)]) is None
    assert value_envelope("a", 1, "k", b"ok", None, [("raw", 0, 1, 0)]) is None


def envelopes() -> st.SearchStrategy[Envelope]:
    """Envelopes of every shape: units (with or without a chain), plain records, and
    fields a unit does not have."""
    refs = st.lists(st.builds(SourceRef, topic=st.text(max_size=8), partition=INT32,
                              offset=INT64 | EDGES, index=INT32), max_size=3)
    items = st.lists(st.builds(Item, index=INT32 | st.sampled_from([0, 1, 127, 128, -1]),
                               payload=st.binary(max_size=40),
                               event_time_ms=INT64 | EDGES, event_id=st.text(max_size=8)),
                     max_size=4)

    def build(key: str, payload_type: str, chain: list[SourceRef], unit: list[Item],
              event_id: str, payload: bytes, time_ms: int) -> Envelope:
        envelope = Envelope(key=key, payload_type=payload_type, event_id=event_id,
                            payload=payload, event_time_ms=time_ms)
        envelope.source_chain.extend(chain)
        envelope.items.extend(unit)
        return envelope

    return st.builds(build, st.text(max_size=8), st.text(max_size=8), refs, items,
                     st.just("") | st.text(max_size=4), st.just(b"") | st.binary(max_size=4),
                     st.just(0) | INT64 | EDGES)


def read_by_protobuf(data: bytes) -> Any:
    """What ``read_envelope`` must answer, as protobuf reads ``data``: None where it
    refuses it (``read_envelope`` may also answer None for more)."""
    try:
        envelope = Envelope.FromString(data)
    except DecodeError:
        return None
    return ([(r.topic, r.partition, r.offset, r.index) for r in envelope.source_chain],
            [item.index for item in envelope.items], [item.payload for item in envelope.items],
            envelope.payload)


@settings(max_examples=500, deadline=None)
@given(envelopes(), st.data())
def test_an_envelope_is_read_as_protobuf_reads_it(envelope: Envelope,
                                                  data: st.DataObject) -> None:
    """Written by protobuf, then perhaps damaged (cut, bytes changed, bytes added):
    whatever ``read_envelope`` reads, protobuf reads the same; a whole envelope it always
    reads."""
    wire = envelope.SerializeToString()
    damage = data.draw(st.sampled_from(["none", "cut", "flip", "append"]))
    if damage == "cut" and wire:
        wire = wire[:data.draw(st.integers(0, len(wire) - 1))]
    elif damage == "flip" and wire:
        at = data.draw(st.integers(0, len(wire) - 1))
        wire = wire[:at] + bytes([data.draw(st.integers(0, 255))]) + wire[at + 1:]
    elif damage == "append":
        wire += data.draw(st.binary(min_size=1, max_size=6))
    read = read_envelope(wire)
    if read is not None:
        assert read == read_by_protobuf(wire)
    elif damage == "none":
        pytest.fail("a whole envelope was not read")
    unit = read_envelope(wire, plain=False)  # units only
    if unit is not None:
        assert unit == read and unit[1], "only a unit is read"
    elif damage == "none" and envelope.items and not envelope.event_id \
            and not envelope.payload and not envelope.event_time_ms:
        pytest.fail("a whole unit of only a unit's fields was not read")


def head_or_error(heads: Heads, record: Rec) -> Any:
    try:
        head = heads(record, (record.topic, record.partition), record.offset, None)
    except (FormatError, StageFailure) as error:
        return type(error), str(error)
    return None if head is None else head[1:]  # the envelope aside: the wire path has none


@settings(max_examples=400, deadline=None)
@given(envelopes(), st.data())
def test_the_head_of_an_envelope_read_off_the_wire_is_protobufs(envelope: Envelope,
                                                               data: st.DataObject) -> None:
    """A topic without republish steps (units, and perhaps every envelope, read off the
    wire) and one with them (read through protobuf) make the same head of every record, or
    refuse it in the same words;
    chains often rooted at the consumed partition itself (forged ones among them)."""
    pipeline = Pipeline("p", topics=("in",)).map("m", lambda value: value)
    wire_heads = Heads(pipeline, None, ["in"], plain=data.draw(st.booleans()))
    protobuf_heads = Heads(pipeline, None, [])
    if data.draw(st.booleans()) and envelope.source_chain:
        envelope.source_chain[0].topic, envelope.source_chain[0].partition = "in", 0
    value = envelope.SerializeToString()
    if data.draw(st.booleans()) and value:
        value = value[:data.draw(st.integers(0, len(value) - 1))]
    record = Rec("in", 0, data.draw(st.integers(0, 2**40)), value)
    assert head_or_error(wire_heads, record) == head_or_error(protobuf_heads, record)
