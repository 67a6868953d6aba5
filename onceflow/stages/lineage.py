"""Where an event came from, and where it sits in its root partition's order.

An event's *root* is the first entry of its envelope's source chain (or the
consumed record itself when the chain is empty). Its *position* orders it
among all events of that root partition: the root offset, then every fan-out
index on the way (root index, each later republish hop's index, each
in-process flat-map's index). Positions compare as tuples, so replays of
the same input always land at or below the watermark they already reached.
Offsets of intermediate hops are left out on purpose: a republisher that
re-sends after a crash writes the same event at a new offset.

An event's *route* is the path it travelled: its root partition and the
partition of every later hop it was consumed from. Watermarks are kept per
route, not per root, because only along one path do the first copies of a
root partition's events arrive in position order: each hop's partition has
one writer at a time per input partition, writing in its input's order. A
root partition whose events were re-keyed twice reaches a consumer through
many intermediate partitions, which interleave freely; one watermark per
root would take a new event that overtook an older one for a copy (a silent
loss). A copy re-sent anywhere travels its original's path (the partition
maps are deterministic), so it meets its original's watermark. A one-hop
chain's route is its root partition, as before routes existed.
"""

from __future__ import annotations

from collections.abc import Sequence

from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.shared_types import Hop as Hop  # defined there, once

RootPartition = tuple[str, int]
#: ``(root, partition)`` for a root partition, or ``("<root>/<p>>...><last hop topic>",
#: last hop partition)`` for a longer path (Kafka topic names hold neither ``/`` nor ``>``).
Route = tuple[str, int]
Position = tuple[int, ...]

#: A root offset's bits below its log's generation (``root_offset``): 2**40 offsets per
#: partition and generation, 2**23 generations within an int64.
GENERATION_BITS = 40


def root_offset(generation: int, offset: int) -> int:
    """The offset a republisher writes in a chain's root for ``offset`` of a root
    partition whose log is in ``generation``.

    A root topic deleted and re-created under its name restarts at offset 0,
    below every position downstream watermarks hold of its old log: its new
    events would be discarded as copies by every pipeline that reads what was
    republished from it. ``onceflow forget --topic T`` on the pipeline reading
    ``T`` counts the log's generation up (``checkpoint.log_marks``), and its roots
    continue above the old ones, so readers further down need nothing.
    Generation 0 (never forgotten) writes offsets as they are.
    """
    return (generation << GENERATION_BITS) | offset


def split_root_offset(written: int) -> tuple[int, int]:
    """``root_offset``'s generation and offset back (the tail scan of an exclusive output,
    whose positions are its input's offsets)."""
    return written >> GENERATION_BITS, written & ((1 << GENERATION_BITS) - 1)


def root_of(envelope: Envelope | None, topic: str, partition: int, offset: int) -> tuple[
    RootPartition, Position
]:
    """Root partition and position of a record consumed at topic/partition/offset.

    A raw record (``envelope`` None: a json, bytes or str source) is its own
    root, like an envelope with an empty chain.
    """
    if envelope is None or not envelope.source_chain:
        return (topic, partition), (offset,)
    chain = envelope.source_chain
    root = chain[0]
    return (root.topic, root.partition), (root.offset, *(ref.index for ref in chain))



def hops_of(chain: Sequence[SourceRef]) -> list[Hop]:
    """A protobuf source chain as plain values, each field read once (a protobuf field is
    built anew each time it is read).

    By index, not ``for ref in chain``: upb's repeated fields have no ``__iter__``, so
    Python iterates them by ``__getitem__`` until an IndexError, whose raising and
    catching cost as much as reading a one-hop chain three times over.
    """
    hops = []
    for at in range(len(chain)):
        ref = chain[at]
        hops.append((ref.topic, ref.partition, ref.offset, ref.index))
    return hops


def chain_origin(chain: Sequence[SourceRef]) -> tuple[RootPartition, Route, Position]:
    """``root_of`` and ``route_of`` of a record with this non-empty source chain, in one
    call (the runner's per-record path)."""
    return origin_of_hops(hops_of(chain))


def origin_of_hops(chain: list[Hop]) -> tuple[RootPartition, Route, Position]:
    """``chain_origin`` of a non-empty chain of plain hops (``hops_of``, or one read off
    the wire by ``unit_wire.read_envelope``)."""
    first = chain[0]
    root = (first[0], first[1])
    if len(chain) == 1:  # one hop (a republisher's output): its root is its route
        return root, root, (first[2], first[3])
    return root, route_of_hops(chain), (first[2], *(hop[3] for hop in chain))


def route_of(envelope: Envelope | None, topic: str, partition: int) -> Route:
    """The path a record consumed from topic/partition travelled, as a watermark key.

    The consumed partition itself is not part of it (a consumer reads one
    partition in order); the chain's hops are.
    """
    if envelope is None or not envelope.source_chain:
        return topic, partition
    return route_of_chain(envelope.source_chain)


def route_of_chain(chain: Sequence[SourceRef]) -> Route:
    """``route_of`` a non-empty source chain."""
    return route_of_hops(hops_of(chain))


def route_of_hops(chain: list[Hop]) -> Route:
    """``route_of_chain`` of a non-empty chain of plain hops."""
    *path, last = chain
    if not path:
        return last[0], last[1]
    return ">".join([*(f"{hop[0]}/{hop[1]}" for hop in path), last[0]]), last[1]


def event_id(root: RootPartition, position: Position) -> str:
    """A deterministic id: the same event re-sent after a crash keeps its id."""
    return f"{root[0]}/{root[1]}/{'.'.join([str(index) for index in position])}"  # not map()
