"""What Kafka says about a source record, handed to a pipeline built ``with_meta=True``.

Its own module so that it stays a plain Python dataclass: the record path's
modules are compiled (``onceflow.compiled``), and a compiled class cannot be
copied or pickled as a dataclass can, while this one is a value users keep.
``onceflow.stages.formats`` builds it and exports it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.shared_types import ConsumedHeader

__all__ = ["RecordMeta"]


@dataclass(frozen=True, slots=True)
class RecordMeta:
    """What Kafka says about a source record, for a pipeline built ``with_meta=True``.

    ``timestamp_ms`` is the record's Kafka timestamp (create or log-append
    time, as the topic is configured); ``envelope`` is the parsed envelope on
    an ``envelope`` topic (event id, event time, key, source chain), on a raw
    topic the chain of a plain onceflow output (``onceflow.stages.origin``),
    else None.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: tuple[ConsumedHeader, ...]  # Kafka allows a null value
    timestamp_ms: int | None
    envelope: Envelope | None = None

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None when the record has none."""
        found = None
        for header, value in self.headers:
            if header == name:
                found = value
        return found
