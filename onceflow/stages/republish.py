"""A republish step's outputs for one consumed record: envelope or plain, partitioned,
less what an exclusive step finds already written.

Split from the runner so that the output side of a republish stays in one
place: the envelope and its chain (``lineage``), the plain format's headers
(``origin``), the partition map and the resume marks of exclusive steps
(``output_tail``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.formats import ENVELOPE_MARK, FORMAT_HEADER
from onceflow.stages.lineage import Position, RootPartition, event_id
from onceflow.stages.origin import plain_headers
from onceflow.stages.outcome import ConsumedRecord, Output
from onceflow.stages.pipeline import Republish
from onceflow.stages.state import TopicPartition


class WrittenOutputs:
    """Per exclusive output topic and input partition: the highest position (offset,
    fan-out index) already in the output, found by the tail scan on assignment.

    A mark is dropped once the replay passes its offset: every later output is new.
    """

    def __init__(self) -> None:
        self._marks: dict[tuple[str, TopicPartition], Position] = {}

    def resume(self, topic: str, written: Mapping[TopicPartition, Position],
               scanned: Iterable[TopicPartition]) -> None:
        """The scan of ``topic`` covered the input partitions ``scanned`` and found
        ``written``; their older marks go."""
        for tp in scanned:
            self._marks.pop((topic, tp), None)
        for tp, position in written.items():
            self._marks[(topic, tp)] = position

    def up_to(self, topic: str, record: ConsumedRecord) -> Position | None:
        """The mark of the record's input partition in ``topic``, None if none applies."""
        slot = (topic, (record.topic, record.partition))
        mark = self._marks.get(slot)
        if mark is not None and record.offset > mark[0]:
            del self._marks[slot]
            return None
        return mark

    def __len__(self) -> int:
        return len(self._marks)


def defaults(envelope: Envelope | None, record: ConsumedRecord) -> tuple[int, str]:
    """Event time and key of outputs whose step gives none: the envelope's, or for a raw
    record its Kafka timestamp and key (UTF-8)."""
    if envelope is not None:
        return envelope.event_time_ms, envelope.key
    return record.timestamp or 0, (record.key or b"").decode(errors="replace")


def republished(
    step: Republish,
    envelope: Envelope | None,
    record: ConsumedRecord,
    root: RootPartition,
    values: list[tuple[Position, Any]],
    time_ms: int,
    key: str,
    written: WrittenOutputs,
) -> tuple[list[Position], list[Output]]:
    """The outputs (and their values' positions) of ``values`` consumed in ``record``.

    The ``j``-th value gets fan-out index ``j`` in the chain's new hop; an
    exclusive step skips the outputs at or below what is already written.
    """
    positions: list[Position] = []
    outputs: list[Output] = []
    partition = step.partition_of(record.topic, record.partition)
    mark = written.up_to(step.topic, record) if step.exclusive else None
    prior = envelope.source_chain if envelope is not None else ()
    topic, in_partition, offset = record.topic, record.partition, record.offset
    headers: tuple[tuple[str, bytes], ...]
    for j, (pos, value) in enumerate(values):
        if mark is not None and (offset, j) <= mark:
            continue
        out = Envelope(
            event_id=event_id(root, pos),
            event_time_ms=step.event_time_ms(value) if step.event_time_ms else time_ms,
            key=step.key(value) if step.key else key,
            payload=step.encode(value),
            payload_type=step.payload_type,
        )
        # The source chain grows by one hop: this record, output j (built in place, cheaper
        # than a list of SourceRef messages per output).
        chain = out.source_chain
        if prior:
            chain.extend(prior)
        chain.add(topic=topic, partition=in_partition, offset=offset, index=j)
        if step.format == "envelope":
            payload, headers = out.SerializeToString(), (ENVELOPE_MARK,)
        else:
            payload = out.payload
            headers = ((FORMAT_HEADER, step.format.encode()),
                       *plain_headers(out.source_chain, out.event_id, out.event_time_ms))
        positions.append(pos)
        outputs.append(Output(step.topic, out.key.encode() or None, payload, headers, partition))
    return positions, outputs
