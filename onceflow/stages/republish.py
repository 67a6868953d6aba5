"""A republish step's outputs for one consumed record: envelope or plain, partitioned,
less what an exclusive step finds already written.

Split from the runner so that the output side of a republish stays in one
place: the envelope and its chain (``lineage``), the plain format's headers
(``origin``), the partition map and the resume marks of exclusive steps
(``tail_scan``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.formats import ENVELOPE_MARK, FORMAT_HEADER
from onceflow.stages.guards import checked_key
from onceflow.stages.lineage import Position, RootPartition, event_id, hops_of, root_offset
from onceflow.stages.origin import plain_headers
from onceflow.stages.outcome import ConsumedRecord, Output
from onceflow.stages.pipeline import Republish
from onceflow.stages.state import TopicPartition
from onceflow.stages.unit_wire import ItemFields, Ref, unit_envelope, value_envelope


class WrittenOutputs:
    """Per exclusive output topic and input partition: the highest position (offset,
    fan-out index) already in the output, found by the tail scan on assignment.

    A mark is dropped once the replay passes its offset: every later output is new.
    """

    def __init__(self) -> None:
        self._marks: dict[tuple[str, TopicPartition], Position] = {}
        self.skipped: dict[str, int] = {}  # topic -> outputs left out, since last taken

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


#: Payload bytes past which a unit step starts a new unit for the same run: a unit of a huge
#: fan-out must stay far below the producer's request size (1 MiB at least).
UNIT_MAX_BYTES = 262_144


def republished(
    step: Republish,
    envelope: Envelope | None,
    record: ConsumedRecord,
    root: RootPartition,
    values: list[tuple[Position, Any]],
    time_ms: int,
    key: str,
    written: WrittenOutputs,
    generation: int = 0,
) -> tuple[list[Position], list[Output]]:
    """The outputs (and their values' positions) of ``values`` consumed in ``record``.

    The ``j``-th value gets fan-out index ``j`` in the chain's new hop; an
    exclusive step skips the outputs at or below what is already written
    (``tail_scan``: the input offset, the input's own last index, ``j``).
    A value from an item of a consumed unit gets what it would have had from
    the item's record: the item's chain (its last index the item's), the
    item's event time by default, and ``j`` counted within the item.
    A record of a root topic (no chain) is written as the chain's root at its offset in
    the log's ``generation`` (``lineage.root_offset``).
    """
    if step.unit:
        return _units(step, envelope, record, root, values, time_ms, key, generation)
    # The user's functions: what they answer is protobuf's to accept or refuse (a numpy
    # integer, say), not a hint's (``onceflow.compiled``).
    encode: Callable[[Any], Any] = step.encode
    key_of: Callable[[Any], Any] | None = step.key
    event_time: Callable[[Any], Any] | None = step.event_time_ms
    positions: list[Position] = []
    outputs: list[Output] = []
    partition = step.partition_of(record.topic, record.partition)
    mark = written.up_to(step.topic, record) if step.exclusive else None
    prior: list[Ref] = [] if envelope is None else hops_of(envelope.source_chain)
    hop = len(prior)
    times = _item_times(envelope)
    fan = _fan_out(values, hop) if times else None
    lead = prior[-1][3] if prior else -1
    topic, in_partition, offset = record.topic, record.partition, record.offset
    hop_offset = offset if prior else root_offset(generation, offset)
    wire = step.format == "envelope"
    headers: tuple[tuple[str, bytes], ...]
    for n, (pos, value) in enumerate(values):
        j = fan[n] if fan is not None else n
        if mark is not None and ((offset, pos[hop] if times else lead, j) if prior
                                 else (offset, j)) <= mark:
            continue
        ident = event_id(root, pos)
        when = (event_time(value) if event_time is not None
                else times[pos[hop]] if times else time_ms)
        out_key = checked_key(key_of(value)) if key_of is not None else key
        payload = encode(value)
        # The source chain grows by one hop: this record, output j.
        chain = list(prior)
        if times:
            last_topic, last_partition, last_offset, _ = chain[-1]
            chain[-1] = (last_topic, last_partition, last_offset, pos[hop])
        chain.append((topic, in_partition, hop_offset, j))
        encoded = value_envelope(ident, when, out_key, payload, step.payload_type,
                                 chain) if wire else None
        if encoded is None:  # the plain format, or a value unit_wire leaves to protobuf
            out = _built_value(ident, when, out_key, payload, step.payload_type, chain)
            out_key = out.key
            if wire:
                encoded = out.SerializeToString()
            else:
                encoded = out.payload
                headers = ((FORMAT_HEADER, step.format.encode()),
                           *plain_headers(out.source_chain, out.event_id, out.event_time_ms))
        if wire:
            headers = (ENVELOPE_MARK,)
        positions.append(pos)
        outputs.append(Output(step.topic, out_key.encode() or None, encoded, headers, partition))
    if mark is not None and len(positions) < len(values):
        written.skipped[step.topic] = written.skipped.get(step.topic, 0) + len(values) - len(
            positions)
    return positions, outputs


def _units(
    step: Republish,
    envelope: Envelope | None,
    record: ConsumedRecord,
    root: RootPartition,
    values: list[tuple[Position, Any]],
    time_ms: int,
    key: str,
    generation: int,
) -> tuple[list[Position], list[Output]]:
    """``republished`` for a unit step: one envelope per run of consecutive values with one
    key (and one source item, for a consumed unit: a unit's items share their chain), cut
    into several past ``UNIT_MAX_BYTES``; each unit's position is its first value's.
    Written by ``unit_wire``, or built through protobuf for values it does not write."""
    encode: Callable[[Any], Any] = step.encode  # as in ``republished``
    key_of: Callable[[Any], Any] | None = step.key
    event_time: Callable[[Any], Any] | None = step.event_time_ms
    positions: list[Position] = []
    units: list[tuple[Any, list[Ref], list[ItemFields]]] = []  # key, chain, items
    prior: list[Ref] = [] if envelope is None else hops_of(envelope.source_chain)
    hop = len(prior)
    times = _item_times(envelope)
    partition = step.partition_of(record.topic, record.partition)
    topic, in_partition = record.topic, record.partition
    offset = record.offset if prior else root_offset(generation, record.offset)
    fan = _fan_out(values, hop) if times else None
    items: list[ItemFields] = []
    run: tuple[Any, int] | None = None
    size = 0
    for n, (pos, value) in enumerate(values):
        j = fan[n] if fan is not None else n
        out_key = checked_key(key_of(value)) if key_of is not None else key
        source = pos[hop] if times else -1
        payload = encode(value)
        size += len(payload)
        if run != (out_key, source) or size > UNIT_MAX_BYTES:
            run, size = (out_key, source), len(payload)
            chain = list(prior)
            if times:
                last_topic, last_partition, last_offset, _ = chain[-1]
                chain[-1] = (last_topic, last_partition, last_offset, source)
            chain.append((topic, in_partition, offset, j))
            items = []
            units.append((out_key, chain, items))
            positions.append(pos)
        items.append((j, payload, (event_time(value) if event_time is not None
                                   else times[source] if times else time_ms),
                      event_id(root, pos)))
    outputs: list[Output] = []
    for out_key, chain, unit_items in units:
        written = unit_envelope(out_key, step.payload_type, chain, unit_items)
        if written is None:  # a value unit_wire leaves to protobuf, to accept or refuse
            unit = _built_unit(out_key, step.payload_type, chain, unit_items)
            written, out_key = unit.SerializeToString(), unit.key
        outputs.append(Output(step.topic, out_key.encode() or None, written, (ENVELOPE_MARK,),
                              partition))
    return positions, outputs


def _built_value(ident: Any, when: Any, key: Any, payload: Any, payload_type: str,
                 chain: list[Ref]) -> Envelope:
    """One value's envelope built through protobuf (``unit_wire.value_envelope``'s
    reference): it accepts or refuses the user's values in its own words."""
    out = Envelope(event_id=ident, event_time_ms=when, key=key, payload=payload,
                   payload_type=payload_type)
    refs = out.source_chain
    for ref_topic, ref_partition, ref_offset, ref_index in chain:
        refs.add(topic=ref_topic, partition=ref_partition, offset=ref_offset, index=ref_index)
    return out


def _built_unit(key: Any, payload_type: str, chain: list[Ref], items: list[ItemFields]
                ) -> Envelope:
    """The unit envelope built through protobuf (``unit_wire.unit_envelope``'s reference)."""
    unit = Envelope(key=key, payload_type=payload_type)
    for ref_topic, ref_partition, ref_offset, ref_index in chain:
        unit.source_chain.add(topic=ref_topic, partition=ref_partition, offset=ref_offset,
                              index=ref_index)
    for index, payload, item_time, item_id in items:
        unit.items.add(index=index, payload=payload, event_time_ms=item_time, event_id=item_id)
    return unit


def _item_times(envelope: Envelope | None) -> dict[int, int] | None:
    """A consumed unit's event time per item index; None for a record of one value."""
    if envelope is None or not envelope.items:
        return None
    items = envelope.items
    times: dict[int, int] = {}
    for at in range(len(items)):  # by index (``lineage.hops_of``)
        item = items[at]
        times[item.index] = item.event_time_ms
    return times


def _fan_out(values: list[tuple[Position, Any]], hop: int) -> list[int]:
    """Fan-out indexes of a consumed unit's values: counted per item (its index is each
    position's entry ``hop``), as each item's own record would have counted them."""
    found = []
    source, j = -1, -1
    for pos, _ in values:
        if pos[hop] != source:
            source, j = pos[hop], -1
        j += 1
        found.append(j)
    return found
