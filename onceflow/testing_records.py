"""The records of a ``onceflow.testing.TestRun``: what goes in, what comes out.

``Record`` is an input before it has an offset, ``Consumed`` the record at
its place in a partition, ``Produced``, ``DeadLetter`` and ``LateEvent`` what
the pipeline produced; ``envelope`` builds an input envelope.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.shared_types import Hop as Hop  # a source chain entry, named here for tests
from onceflow.stages.formats import Format, format_name

__all__ = ["Consumed", "DeadLetter", "Hop", "LateEvent", "Produced", "Record", "envelope"]


def envelope(value: Any = None, *, payload: bytes | None = None, key: str = "",
             event_time_ms: int = 0, chain: Sequence[Hop | SourceRef] = (),
             payload_type: str = "") -> Envelope:
    """An envelope with ``value`` as its JSON payload (or raw ``payload`` bytes).

    ``chain`` makes it a republished record: its first entry is the root the
    aggregates deduplicate on, e.g. ``chain=[("raw", 0, 40, 1)]`` is output 1
    of offset 40 of ``raw/0``.
    """
    env = Envelope(payload=json.dumps(value).encode() if payload is None else payload, key=key,
                   event_time_ms=event_time_ms, payload_type=payload_type)
    for hop in chain:
        env.source_chain.append(hop if isinstance(hop, SourceRef) else SourceRef(
            topic=hop[0], partition=hop[1], offset=hop[2], index=hop[3]))
    return env


@dataclass(frozen=True)
class Record:
    """One input record, before it has an offset.

    ``value`` is sent in the topic's declared format: on an ``envelope``
    topic a JSON-able object becomes the payload of an envelope with ``key``;
    on a ``json`` topic it is sent as JSON, a ``str`` as UTF-8. An
    ``Envelope`` or bytes are sent as they are, whatever the format (a
    serialized envelope, or garbage to test dead letters). ``key`` is the
    Kafka record's key: bytes as they are, a ``str`` as UTF-8; an envelope
    built from ``value`` gets it as text, as the worker reads a Kafka key
    (UTF-8, undecodable bytes replaced). ``headers`` and ``timestamp`` (ms)
    are the Kafka record's. ``topic`` defaults to the pipeline's first topic;
    ``offset`` to the partition's next one.
    """

    value: Any
    topic: str | None = None
    partition: int = 0
    offset: int | None = None
    key: str | bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    timestamp: int | None = None

    def __post_init__(self) -> None:
        if self.key is not None and not isinstance(self.key, str | bytes):
            raise TypeError(f"Record key must be bytes, str or None (the Kafka record's key), "
                            f"got {type(self.key).__name__} {self.key!r}")

    @property
    def key_bytes(self) -> bytes | None:
        """The Kafka record's key."""
        return self.key.encode() if isinstance(self.key, str) else self.key

    def to_bytes(self, fmt: Format = "envelope") -> bytes:
        """The value as a producer of a topic in format ``fmt`` would write it."""
        if isinstance(self.value, bytes):
            return self.value
        if isinstance(self.value, Envelope):
            return self.value.SerializeToString()
        if fmt == "envelope":
            text = self.key.decode(errors="replace") if isinstance(self.key, bytes) else self.key
            return envelope(self.value, key=text or "").SerializeToString()
        if isinstance(self.value, str) and fmt != "json":
            return self.value.encode()
        if fmt == "json":
            return json.dumps(self.value).encode()
        raise TypeError(f"a record for a {format_name(fmt)} topic needs bytes or str, "
                        f"got {self.value!r}")


@dataclass(frozen=True)
class Consumed:
    """A record at its place in a partition, as the worker's consumer hands it over."""

    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None

    @property
    def envelope(self) -> Envelope:
        return Envelope.FromString(self.value)


@dataclass(frozen=True)
class Produced:
    """A record the pipeline produced (republish, repartition, dead letter, late event)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def envelope(self) -> Envelope:
        return Envelope.FromString(self.value)

    @property
    def json(self) -> Any:
        """The envelope's payload parsed as JSON (how repartition steps encode by default)."""
        return json.loads(self.envelope.payload)


@dataclass(frozen=True)
class DeadLetter:
    """A record a user function (or the envelope decoder) failed on, and why."""

    record: Consumed
    reason: str


@dataclass(frozen=True)
class LateEvent:
    """A value too late for its window: not folded, routed to the late-events topic."""

    record: Consumed
    stage: str
    key: str
    position: str  # the value's position in its root partition, e.g. "4.0"
    reason: str
