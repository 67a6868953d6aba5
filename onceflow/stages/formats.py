"""Source formats: how a consumed record's bytes become the first step's input.

A pipeline declares per source topic what its records hold: ``envelope``
(onceflow's own protobuf records), ``json``, ``bytes``, ``str``, or a user
deserializer ``Callable[[bytes], Any]``. Every record onceflow produces
carries the header ``onceflow-format: envelope``, so a raw source that gets
one says so in the dead letter instead of guessing. A value that does not
parse is a ``FormatError``: the runner dead-letters the record with the
message and goes on. A raw record has no chain: it is its own root, exactly
like an envelope with an empty source chain.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf.message import DecodeError

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.shared_types import ConsumedHeader, ConsumedRecord
from onceflow.stages.record_meta import RecordMeta as RecordMeta  # the docs name it here

#: What users name; the parsers and readers are the engine's, imported by name.
__all__ = ["NAMED_FORMATS", "Format", "FormatError", "RecordMeta", "json_bytes", "payload_bytes"]

#: ``"envelope"``, ``"json"``, ``"bytes"``, ``"str"`` or a deserializer of the value bytes.
Format = str | Callable[[bytes], Any]
NAMED_FORMATS = ("envelope", "json", "bytes", "str")
FORMAT_HEADER = "onceflow-format"
#: The header on every record onceflow produces (republish steps, repartition hops).
ENVELOPE_MARK = (FORMAT_HEADER, b"envelope")

#: Parses one record: (the value decode gets, the envelope if the record is one).
Parser = Callable[[ConsumedRecord], tuple[Any, Envelope | None]]


@dataclass(frozen=True, slots=True)
class Reader:
    """How one consumed topic's records become the first value of their segment.

    ``parse`` raises ``FormatError`` (a dead letter naming the topic and the
    formats); ``decode`` is the user's, run as stage ``decode``. ``payload``: what
    ``decode`` does when it reads only the envelope's payload (the default
    decoder, a repartition hop), so a unit's items skip an envelope each
    (``stages.units``).
    """

    parse: Parser
    decode: Callable[[Any], Any]
    with_meta: bool = False
    payload: Callable[[bytes], Any] | None = None


def source_reader(topic: str, fmt: Format, decode: Callable[[Any], Any] | None,
                  with_meta: bool) -> Reader:
    """A source topic: ``decode`` gets the envelope, or the parsed value of a raw format
    (default: the envelope's payload bytes, or the parsed value itself)."""
    payload = None
    if decode is None:
        decode = payload_bytes if fmt == "envelope" else itself
        payload = itself
    return Reader(parser_for(topic, fmt), decode, with_meta, payload)


def hop_reader(topic: str, decode: Callable[[bytes], Any]) -> Reader:
    """A repartition topic: always envelopes, whose payload is the encoded value."""
    return Reader(parser_for(topic, "envelope"), lambda envelope: decode(envelope.payload),
                  payload=decode)


def payload_bytes(envelope: Envelope) -> Any:
    """Default decoder of an envelope topic: hand the payload bytes to the first step."""
    return envelope.payload


def itself(value: Any) -> Any:
    """The default decode of a raw format: the parsed value as it is."""
    return value


class FormatError(Exception):
    """A record is not in its topic's declared format; ``kind`` names the case."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def format_name(fmt: Format) -> str:
    """``json``, ..., or a deserializer's name, for reasons and errors."""
    if isinstance(fmt, str):
        return fmt
    return f"deserializer {getattr(fmt, '__qualname__', None) or repr(fmt)}"


def check_format(owner: str, fmt: Format) -> None:
    """Refuse a format that is neither one of the names nor callable, at build time."""
    if isinstance(fmt, str) and fmt in NAMED_FORMATS:
        return
    if not isinstance(fmt, str) and callable(fmt):
        return
    raise ValueError(f"{owner}: format {fmt!r}: expected one of {', '.join(NAMED_FORMATS)} "
                     "or a callable taking the value bytes")


def parser_for(topic: str, fmt: Format) -> Parser:
    """The parser of ``topic``'s records in format ``fmt``."""
    if fmt == "envelope":
        return lambda record: _envelope(topic, record)
    name = format_name(fmt)
    read = fmt if callable(fmt) else _RAW[fmt]

    def parse(record: ConsumedRecord) -> tuple[Any, Envelope | None]:
        if record.headers and is_marked(record.headers):
            raise FormatError("wrong-format", f"topic {topic!r} is declared {name} but holds "
                              "onceflow envelopes (header onceflow-format=envelope): declare "
                              "format='envelope' for it")
        value = record.value
        if value is None:
            if fmt == "bytes":
                return None, None
            raise FormatError("unparsable", f"topic {topic!r} is declared {name} but the record "
                              "has no value (a tombstone)")
        try:
            return read(value), None
        except Exception as error:
            raise FormatError("unparsable", f"topic {topic!r} is declared {name} but the value "
                              f"does not parse: {type(error).__name__}: {error}") from error

    return parse


#: 19 digits in a row may be an integer beyond 64 bits, which orjson reads as a float
#: (silently rounded: a lost count); the json module reads it exactly. Looked for as
#: 19 zeros in the value with every ASCII digit made "0" and every other byte " ":
#: ``bytes.translate`` and a literal's search are 4x faster than the regex ``\d{19}``.
#: The literal is searched by ``re`` (a prefix search), not ``in``: on text rich in
#: shorter numbers (13-digit timestamps) ``in`` steps one byte at a time, 1.7x as dear.
_DIGITS_AS_ZERO = bytes(b"0"[0] if 0x30 <= i <= 0x39 else b" "[0] for i in range(256))
_LONG_NUMBER = re.compile(b"0" * 19)


def json_value(value: bytes) -> Any:
    """A JSON value, as ``json.loads`` reads it, at orjson's speed.

    orjson parses the common case 3-4x faster. What it reads differently
    goes to ``json.loads``: text with 19 or more digits in a row (orjson
    rounds integers beyond 64 bits to floats), and what it refuses (NaN,
    nesting deeper than 1024), so the result, and the error of a value that
    is not JSON, stay the json module's.
    """
    if _LONG_NUMBER.search(value.translate(_DIGITS_AS_ZERO)) is not None:
        return json.loads(value)
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return json.loads(value)


_RAW: dict[str, Callable[[bytes], Any]] = {
    "json": json_value, "str": bytes.decode, "bytes": lambda value: value}


def is_marked(headers: Sequence[ConsumedHeader] | None) -> bool:
    """True if the record carries onceflow's envelope header."""
    return bool(headers) and any(h == FORMAT_HEADER and v == b"envelope" for h, v in headers or ())


def meta_of(record: ConsumedRecord, envelope: Envelope | None) -> RecordMeta:
    return RecordMeta(record.topic, record.partition, record.offset, record.key,
                      tuple(record.headers or ()), record.timestamp, envelope)


def _envelope(topic: str, record: ConsumedRecord) -> tuple[Envelope, Envelope]:
    try:
        envelope = Envelope.FromString(record.value or b"")
    except DecodeError as error:
        raise FormatError("unparsable", f"undecodable envelope on topic {topic!r} (declared "
                          f"envelope, {_marking(record)}): {error}{_hint(record.value)}"
                          ) from error
    return envelope, envelope


def _marking(record: ConsumedRecord) -> str:
    headers = getattr(record, "headers", None) or ()  # bare test records may have none
    marks = [value for name, value in headers if name == FORMAT_HEADER]
    if not marks:
        return "it has no onceflow-format header"
    mark = (marks[-1] or b"")[:40].decode(errors="replace")  # a null header value is None
    return f"it has the {FORMAT_HEADER}={mark} header"


def _hint(value: bytes | None) -> str:
    """Only on the failure path: say which format the bytes would fit."""
    try:
        json.loads(value or b"")
    except Exception:  # ValueError, or RecursionError for JSON nested too deep
        try:
            (value or b"").decode()
        except UnicodeDecodeError:
            return ""
        return "; the value is text: declare format='str' (or 'bytes', or a deserializer)"
    return "; the value parses as JSON: declare format='json' for this topic"


def json_bytes(value: Any) -> bytes:
    """Default encoding of values crossing a repartition topic (and of plain JSON outputs)."""
    return json.dumps(value, separators=(",", ":")).encode()
