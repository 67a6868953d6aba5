"""Envelopes in protobuf's wire format, written and read without building messages.

A republish step with ``unit=True`` writes one ``Envelope`` per run of values
(``stages.units``), and without it one per value. Built through protobuf's Python
API, each ``items.add`` looks its keyword names up in the message descriptor and
each field set crosses into upb: about half of the chain's republisher's time per
record (``benchmarks/journal/2026-11-25.md``, issue 13, eighth session); an envelope of
one value took twice as long as written here (journal 2026-11-29). Reading is
the same story: each field read from a parsed message builds its value anew
(a source chain's hops, an empty ``items``), about two thirds of the envelope
head's time on a topic whose steps read only payloads (issue 30). The envelope
uses few field types (strings, bytes, int32, int64, nested messages), so this
module writes and reads them itself, as protobuf does: fields in number order,
proto3 defaults (0, empty) left out, negative ints as ten-byte varints. An envelope is
written as one list of parts joined once, each nested message's size filled in when its
fields are in: concatenating each field's bytes copied the payloads over and over and
cost two thirds more per unit (journal 2026-11-29).
``tests/unit/test_unit_wire.py`` pins the writer to ``SerializeToString`` byte for
byte and the reader to ``FromString``.

Only plain values are written here: a key, payload type or event id that is no ``str``,
an event time that is no ``int`` or outside int64, a payload that is no
``bytes``, or text that UTF-8 cannot encode answers None, and the caller
builds the envelope through protobuf (which accepts or refuses the value
as it always did).
"""

from __future__ import annotations

from typing import Any

from onceflow.shared_types import Hop

#: One-byte varints (0-127), shared.
_SMALL = [bytes((n,)) for n in range(128)]
_TWO_64 = 1 << 64
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_PACKED_MAX = 1 << 49  # seven 7-bit groups: the packed int stays below 2**56

# Tags (field number << 3 | wire type): Envelope, SourceRef, Item (envelope.proto).
_ID, _TIME, _KEY, _PAYLOAD = b"\x0a", b"\x10", b"\x1a", b"\x22"
_PAYLOAD_TYPE, _SOURCE, _ITEM = b"\x2a", b"\x32", b"\x3a"
_REF_TOPIC, _REF_PARTITION, _REF_OFFSET, _REF_INDEX = b"\x0a", b"\x10", b"\x18", b"\x20"
_ITEM_INDEX, _ITEM_PAYLOAD, _ITEM_TIME, _ITEM_ID = b"\x08", b"\x12", b"\x18", b"\x22"

#: A source reference: topic, partition, offset, fan-out index (``shared_types.Hop``).
Ref = Hop
#: A unit item: index, payload, event time (ms), event id.
ItemFields = tuple[int, Any, Any, Any]


def varint(value: int) -> bytes:
    """Base-128 varint of ``value`` (0 <= value < 2**64)."""
    if value < 128:
        return _SMALL[value]
    if value < _PACKED_MAX:  # up to seven bytes, gathered in one int first
        packed = shift = 0
        while value > 127:
            packed |= ((value & 127) | 128) << shift
            value >>= 7
            shift += 8
        return (packed | value << shift).to_bytes(shift // 8 + 1, "little")
    out = bytearray()
    while value > 127:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def _signed(value: int) -> bytes:
    """An int32 or int64 field's varint: a negative value as its 64-bit two's complement."""
    return varint(value + _TWO_64 if value < 0 else value)


def _put(parts: list[bytes], tag: bytes, body: bytes) -> int:
    """A length-delimited field appended to ``parts``; answers its size."""
    size = varint(len(body))
    parts.append(tag)
    parts.append(size)
    parts.append(body)
    return 1 + len(size) + len(body)


def _put_ref(parts: list[bytes], ref: Ref) -> None:
    topic, partition, offset, index = ref
    parts.append(_SOURCE)
    at = len(parts)
    parts.append(b"")  # the body's size, once known
    size = _put(parts, _REF_TOPIC, topic.encode()) if topic else 0
    if partition:
        size += _put_int(parts, _REF_PARTITION, partition)
    if offset:
        size += _put_int(parts, _REF_OFFSET, offset)
    if index:
        size += _put_int(parts, _REF_INDEX, index)
    parts[at] = varint(size)


def _put_int(parts: list[bytes], tag: bytes, value: int) -> int:
    encoded = _signed(value)
    parts.append(tag)
    parts.append(encoded)
    return 1 + len(encoded)


def _put_item(parts: list[bytes], fields: ItemFields) -> bool:
    index, payload, time_ms, event_id = fields
    if type(payload) is not bytes or type(time_ms) is not int or type(event_id) is not str \
            or not _INT64_MIN <= time_ms <= _INT64_MAX:
        return False
    parts.append(_ITEM)
    at = len(parts)
    parts.append(b"")  # the body's size, once known
    size = _put_int(parts, _ITEM_INDEX, index) if index else 0
    if payload:
        size += _put(parts, _ITEM_PAYLOAD, payload)
    if time_ms:
        size += _put_int(parts, _ITEM_TIME, time_ms)
    if event_id:
        size += _put(parts, _ITEM_ID, event_id.encode())
    parts[at] = varint(size)
    return True


def unit_envelope(key: Any, payload_type: Any, chain: list[Ref], items: list[ItemFields]
                  ) -> bytes | None:
    """``Envelope(key, payload_type, source_chain, items).SerializeToString()``, or None
    for a value this module does not write (see the module)."""
    if type(key) is not str or type(payload_type) is not str:
        return None
    parts: list[bytes] = []
    try:
        if key:
            _put(parts, _KEY, key.encode())
        if payload_type:
            _put(parts, _PAYLOAD_TYPE, payload_type.encode())
        for ref in chain:
            _put_ref(parts, ref)
        for fields in items:
            if not _put_item(parts, fields):
                return None
    except UnicodeEncodeError:  # a lone surrogate: protobuf refuses it in its own words
        return None
    return b"".join(parts)


def value_envelope(event_id: Any, event_time_ms: Any, key: Any, payload: Any,
                   payload_type: Any, chain: list[Ref]) -> bytes | None:
    """``Envelope(event_id, event_time_ms, key, payload, payload_type, source_chain)
    .SerializeToString()``: one value's envelope; None for a value this module does not
    write (see the module)."""
    if type(event_id) is not str or type(key) is not str or type(payload) is not bytes \
            or type(payload_type) is not str or type(event_time_ms) is not int \
            or not _INT64_MIN <= event_time_ms <= _INT64_MAX:
        return None
    parts: list[bytes] = []
    try:
        if event_id:
            _put(parts, _ID, event_id.encode())
        if event_time_ms:
            _put_int(parts, _TIME, event_time_ms)
        if key:
            _put(parts, _KEY, key.encode())
        if payload:
            _put(parts, _PAYLOAD, payload)
        if payload_type:
            _put(parts, _PAYLOAD_TYPE, payload_type.encode())
        for ref in chain:
            _put_ref(parts, ref)
    except UnicodeEncodeError:  # a lone surrogate: protobuf refuses it in its own words
        return None
    return b"".join(parts)


#: A consumed envelope as ``read_envelope`` reads it: its source chain, its items' indexes
#: and payloads (a unit's; empty for a record of one value) and its payload (unused in a
#: unit).
WireEnvelope = tuple[list[Ref], list[int], list[bytes], bytes]
_UINT64 = (1 << 64) - 1
_INT32_SIGN, _TWO_32 = 1 << 31, 1 << 32
_INT64_SIGN = 1 << 63


def read_envelope(data: bytes, plain: bool = True) -> WireEnvelope | None:
    """An envelope's source chain, items and payload, read as protobuf parses them; None
    for anything else (a field the envelope does not have, a wire type or length that
    does not fit, text that is not UTF-8), and with ``plain`` False for anything but a
    unit of only a unit's fields (no event id, event time or payload of its own): the
    caller parses those with protobuf, which reads or refuses them in its own words.

    The event id, event time, key, payload type and the items' event times and ids are
    checked (text must be UTF-8) but not kept: the head reads only the chain, the
    indexes and the payloads (``heads``). A field given twice keeps its last value, as
    protobuf does.
    """
    chain: list[Ref] = []
    indexes: list[int] = []
    payloads: list[bytes] = []
    payload = b""
    at, end = 0, len(data)
    try:
        while at < end:
            tag = data[at]
            if not plain and (tag == 0x0A or tag == 0x10 or tag == 0x22):  # no unit's
                return None
            size, at = _varint(data, at + 1)
            if tag == 0x10:  # Envelope.event_time_ms: a varint, not kept
                continue
            stop = at + size
            if stop > end:
                return None
            if tag == 0x22:  # Envelope.payload
                payload = data[at:stop]
            elif tag == 0x32:  # Envelope.source_chain
                ref = _ref_of(data, at, stop)
                if ref is None:
                    return None
                chain.append(ref)
            elif tag == 0x3A:  # Envelope.items
                item = _item_of(data, at, stop)
                if item is None:
                    return None
                indexes.append(item[0])
                payloads.append(item[1])
            elif tag == 0x0A or tag == 0x1A or tag == 0x2A:  # event id, key, payload type:
                data[at:stop].decode()  # UTF-8, as protobuf checks
            else:
                return None
            at = stop
    except (IndexError, UnicodeDecodeError):
        return None
    if not plain and not indexes:
        return None
    return chain, indexes, payloads, payload


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` (its low 64 bits, as protobuf keeps them) and the offset after
    it; IndexError past the end or past ten bytes."""
    byte = data[at]
    if byte < 128:
        return byte, at + 1
    value, shift = byte & 127, 7
    while True:
        at += 1
        if shift > 63:
            raise IndexError("varint longer than ten bytes")
        byte = data[at]
        value |= (byte & 127) << shift
        if byte < 128:
            return value & _UINT64, at + 1
        shift += 7


def _int32(value: int) -> int:
    value &= _TWO_32 - 1
    return value - _TWO_32 if value >= _INT32_SIGN else value


def _int64(value: int) -> int:
    return value - _TWO_64 if value >= _INT64_SIGN else value


def _ref_of(data: bytes, at: int, end: int) -> Ref | None:
    topic, partition, offset, index = "", 0, 0, 0
    while at < end:
        tag = data[at]
        value, at = _varint(data, at + 1)
        if tag == 0x0A:
            stop = at + value
            if stop > end:
                return None
            topic = data[at:stop].decode()
            at = stop
        elif tag == 0x10:
            partition = _int32(value)
        elif tag == 0x18:
            offset = _int64(value)
        elif tag == 0x20:
            index = _int32(value)
        else:
            return None
    if at != end:
        return None
    return topic, partition, offset, index


def _item_of(data: bytes, at: int, end: int) -> tuple[int, bytes] | None:
    index, payload = 0, b""
    while at < end:
        tag = data[at]
        value, at = _varint(data, at + 1)
        if tag == 0x12 or tag == 0x22:
            stop = at + value
            if stop > end:
                return None
            if tag == 0x12:
                payload = data[at:stop]
            else:
                data[at:stop].decode()  # the event id: UTF-8, as protobuf checks
            at = stop
        elif tag == 0x08:
            index = _int32(value)
        elif tag != 0x18:  # the event time, not kept
            return None
    if at != end:
        return None
    return index, payload
