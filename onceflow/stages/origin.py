"""The origin of a plain (non-envelope) output, carried in Kafka headers.

A republish step with ``format="json"`` or ``"bytes"`` writes the encoded
value itself, so that a consumer that knows nothing of onceflow reads an
ordinary record. What the envelope would have carried goes into headers:
this hop's input (``onceflow-origin-topic``, ``-partition``, ``-offset``,
``-index``), the event id and time, and the whole source chain
(``onceflow-chain``), which a onceflow pipeline reading the topic with a raw
format turns back into an envelope-less root, so its aggregates dedup on
the chain's root exactly as for envelopes.
"""

from __future__ import annotations

from collections.abc import Sequence

from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.stages.formats import FormatError
from onceflow.stages.lineage import hops_of
from onceflow.stages.outcome import ConsumedHeader

Header = tuple[str, bytes]
CHAIN_HEADER = "onceflow-chain"
EVENT_ID_HEADER = "onceflow-event-id"
EVENT_TIME_HEADER = "onceflow-event-time-ms"
ORIGIN_HEADERS = ("onceflow-origin-topic", "onceflow-origin-partition",
                  "onceflow-origin-offset", "onceflow-origin-index")


def encode_chain(chain: Sequence[SourceRef]) -> bytes:
    """``topic/partition/offset/index`` per hop, comma separated (Kafka topic names
    hold neither character); the hops read by index (``lineage.hops_of``)."""
    return ",".join([f"{topic}/{partition}/{offset}/{index}"
                     for topic, partition, offset, index in hops_of(chain)]).encode()


def decode_chain(text: bytes) -> list[SourceRef]:
    """The inverse of ``encode_chain``; ValueError if it is not one."""
    chain = []
    for hop in text.decode().split(","):
        topic, partition, offset, index = hop.rsplit("/", 3)
        if not topic:
            raise ValueError(f"no topic in source chain hop {hop!r}")
        numbers = int(partition), int(offset), int(index)
        if min(numbers) < 0:
            raise ValueError(f"negative number in source chain hop {hop!r}")
        chain.append(SourceRef(topic=topic, partition=numbers[0], offset=numbers[1],
                               index=numbers[2]))
    return chain


def plain_headers(chain: Sequence[SourceRef], event_id: str, event_time_ms: int
                  ) -> tuple[Header, ...]:
    """The headers of a plain output whose envelope would have held this chain."""
    last = chain[-1]
    return (
        *zip(ORIGIN_HEADERS, (last.topic.encode(), str(last.partition).encode(),
                              str(last.offset).encode(), str(last.index).encode()), strict=True),
        (EVENT_ID_HEADER, event_id.encode()),
        (EVENT_TIME_HEADER, str(event_time_ms).encode()),
        (CHAIN_HEADER, encode_chain(chain)),
    )


def header(headers: Sequence[ConsumedHeader] | None, name: str) -> bytes | None:
    """The last value of header ``name``, None if absent."""
    found = None
    for key, value in headers or ():
        if key == name:
            found = value
    return found


def chain_envelope(key: bytes | None, timestamp_ms: int | None,
                   headers: Sequence[ConsumedHeader] | None) -> Envelope | None:
    """For a raw record written by a plain republish: an envelope holding its chain (no
    payload), so the runner roots it where the chain starts; None for any other record.

    A chain header that does not parse (or an event time header that is not an
    integer) is a ``FormatError``: onceflow never writes one, and such a record
    can be rooted neither at its chain nor at itself (if it is a damaged
    onceflow output, its re-sent copies would each count).
    """
    text = header(headers, CHAIN_HEADER)
    if text is None:
        return None
    try:
        chain = decode_chain(text)
        time_ms = int(header(headers, EVENT_TIME_HEADER) or timestamp_ms or 0)
        return Envelope(
            event_id=(header(headers, EVENT_ID_HEADER) or b"").decode(errors="replace"),
            event_time_ms=time_ms, key=(key or b"").decode(errors="replace"),
            source_chain=chain)
    except (ValueError, TypeError) as error:  # UnicodeDecodeError is a ValueError
        shown = text[:100].decode(errors="replace") + ("..." if len(text) > 100 else "")
        raise FormatError("chain", f"header {CHAIN_HEADER}={shown!r} (or "
                          f"{EVENT_TIME_HEADER}) does not parse: {type(error).__name__}: "
                          f"{str(error)[:200]}") from error
