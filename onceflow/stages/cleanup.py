"""Re-keying exactly once: copy a regrouped topic into a pristine one, without the copies.

A republisher that re-keys (``partition="key"``) has many writers per output
partition, so it cannot resume from its output's tail as an exclusive step
does: after a crash it re-sends the outputs of the inputs it had not
committed, and the *regrouped* topic holds some records twice. ``cleanup``
builds the pipeline that reads the regrouped topic and writes each record
once, in order, to a *pristine* topic with the same partitioning:

1. ``deduplicate`` (an aggregate keyed by the regrouped partition) keeps, per
   route (root partition and the partitions of any hops in between,
   ``onceflow.stages.lineage``), the highest position it let through,
   persisted with the state like every aggregate watermark (invariants 2, 4,
   5): a record at or below it is a re-sent copy and goes no further.
2. An exclusive republish writes what passes to the same partition number of
   the pristine topic, so the cleanup's own crashes write nothing twice
   either (``onceflow.stages.tail_scan``).

Why the watermark rule holds: within one regrouped partition, the records of
one route come from one writer at a time (the worker that owns the re-keying
step's input partition on that path), in the order it processed them (route
order, invariant 8), so their positions rise; a successor replays from the
committed offset and re-sends positions at or below what is there. The
re-keying step may read the root topic or a topic that was itself re-keyed:
a copy already in its input travels the same route and is dropped too.
"""

from __future__ import annotations

from typing import Any

from onceflow.stages.formats import RecordMeta
from onceflow.stages.pipeline import Pipeline

__all__ = ["DEDUP_STAGE", "PRISTINE_STAGE", "cleanup"]

#: The stage ids of the pipeline ``cleanup`` builds (ids key persisted state).
DEDUP_STAGE = "first_seen"
PRISTINE_STAGE = "pristine"


def regrouped_partition(pair: tuple[Any, RecordMeta]) -> str:
    """The dedup key: the regrouped partition the record was consumed from."""
    return str(pair[1].partition)


def payload(pair: tuple[Any, RecordMeta]) -> Any:
    """The consumed value, without its meta."""
    return pair[0]


def unchanged(value: bytes) -> bytes:
    """The pristine record's value: the regrouped record's bytes, as they were."""
    return value


def cleanup(id: str, regrouped: str, pristine: str, *, store: str = "redis",
            regrouped_format: str = "json", format: str = "json") -> Pipeline:
    """The pipeline that copies ``regrouped`` into ``pristine``, each record once, in order.

    ``regrouped_format``: what the re-keying step wrote, ``"json"`` or
    ``"bytes"`` (a plain output) or ``"envelope"``; the pristine record's
    value is its value bytes (the envelope's payload), unchanged, with the
    same Kafka key and the origin headers of a plain output, marked
    ``format`` (``"json"`` or ``"bytes"``). Partition ``q`` of the regrouped
    topic goes to partition ``q`` of the pristine one, which must have at
    least as many partitions. The watermarks live in ``store``; the pipeline
    runs on any number of workers (one consumer group).

    Example:
        >>> p = cleanup("lines-cleanup", "lines-by-sku", "lines-by-sku-pristine")
        >>> [step.id for step in p.steps]
        ['first_seen', 'value', 'pristine']
    """
    if regrouped_format not in ("json", "bytes", "envelope"):
        raise ValueError(f"cleanup {id!r}: regrouped_format {regrouped_format!r}: expected "
                         "json, bytes or envelope")
    source = "envelope" if regrouped_format == "envelope" else "bytes"  # the bytes, unparsed
    return (
        Pipeline(id, topics=(regrouped,), format=source, with_meta=True)
        .deduplicate(DEDUP_STAGE, key=regrouped_partition, store=store)
        .map("value", payload)
        .republish(PRISTINE_STAGE, pristine, encode=unchanged, exclusive=True, format=format)
    )
