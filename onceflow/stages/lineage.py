"""Where an event came from, and where it sits in its root partition's order.

An event's *root* is the first entry of its envelope's source chain (or the
consumed record itself when the chain is empty). Its *position* orders it
among all events of that root partition: the root offset, then every fan-out
index on the way (root index, each later republish hop's index, each
in-process flat-map's index). Positions compare as tuples, so replays of
the same input always land at or below the watermark they already reached.
Offsets of intermediate hops are left out on purpose: a republisher that
re-sends after a crash writes the same event at a new offset.
"""

from __future__ import annotations

from onceflow.protos.envelope_pb2 import Envelope, SourceRef

RootPartition = tuple[str, int]
Position = tuple[int, ...]


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


def extended_chain(
    envelope: Envelope | None, topic: str, partition: int, offset: int, index: int
) -> list[SourceRef]:
    """The source chain of the ``index``-th output republished from this record."""
    chain = [] if envelope is None else list(envelope.source_chain)
    chain.append(SourceRef(topic=topic, partition=partition, offset=offset, index=index))
    return chain


def event_id(root: RootPartition, position: Position) -> str:
    """A deterministic id: the same event re-sent after a crash keeps its id."""
    return f"{root[0]}/{root[1]}/" + ".".join(map(str, position))
