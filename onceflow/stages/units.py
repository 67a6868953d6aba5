"""Units: several outputs of one consumed record crossing a republish hop as one record.

A republish step built with ``unit=True`` writes a run of consecutive outputs
that share a Kafka key (and, when its input was itself a unit, an input
item) as one envelope whose ``items`` hold them (``stages.republish``). The
reader expands a unit back into its items, each at the position it would
have had as a record of its own: the unit's position with the last hop's
index replaced by the item's (``stages.lineage``). So watermarks, windows,
late events and dead letters downstream see the same values at the same
positions, while Kafka carries, and the consumer parses, one record per run.

Runs of *consecutive* outputs only: each output partition then receives the
record's outputs in fan-out order, as it did one record each, which the
per-route watermarks downstream rely on (a key's values arrive in position
order).
"""

from __future__ import annotations

from typing import Any

from onceflow.protos.envelope_pb2 import Envelope, Item
from onceflow.stages.formats import FormatError, Reader, meta_of
from onceflow.stages.lineage import Position
from onceflow.stages.outcome import ConsumedRecord


def unit_of(envelope: Envelope | None) -> tuple[list[Item], list[int]] | None:
    """A unit's items and their indexes, read once (None if the envelope is no unit);
    FormatError for a unit no republish step can have written.

    Its items' positions come from its source chain, so it needs one, and
    their indexes must rise (fan-out order): items out of order would fold
    a value after a later one and take it for a copy.
    """
    if envelope is None:
        return None
    repeated = envelope.items  # each read of a protobuf field builds its value anew
    items = [repeated[at] for at in range(len(repeated))]  # by index (``lineage.hops_of``)
    if not items:
        return None
    if not envelope.source_chain:
        raise FormatError("unit", "a unit (envelope with items) without a source chain: "
                          "forged or corrupt")
    indexes = [item.index for item in items]
    disorder = out_of_order(indexes)
    if disorder is not None:
        raise FormatError("unit", f"unit item index {disorder[0]} after {disorder[1]}: items "
                          "must be in fan-out order")
    return items, indexes


def out_of_order(indexes: list[int]) -> tuple[int, int] | None:
    """The first item index not above the one before it (and that one), None if they rise
    from 0 up: a unit's items are in fan-out order."""
    last = -1
    for index in indexes:
        if index <= last:
            return index, last
        last = index
    return None


def expand(reader: Reader, envelope: Envelope, unit: tuple[list[Item], list[int]],
           record: ConsumedRecord, position: Position) -> tuple[list[Any], list[Position]]:
    """A checked unit's items (``unit_of``) as the first step's values, with their
    positions.

    A decoder that reads only the payload gets each item's payload; any
    other gets the envelope the item would have been alone (``item_view``).
    A failing decode fails the whole record (one dead letter, as for a
    record of one value).
    """
    items, indexes = unit
    base = position[:-1]
    positions = [base + (index,) for index in indexes]  # noqa: RUF005
    fast = reader.payload
    if fast is not None and not reader.with_meta:
        return [fast(item.payload) for item in items], positions
    template = _template(envelope)
    values: list[Any] = []
    for item in items:
        view = item_view(template, item)
        value = reader.decode(view)
        values.append((value, meta_of(record, view)) if reader.with_meta else value)
    return values, positions


def item_view(unit: Envelope, item: Item) -> Envelope:
    """The envelope ``item`` of ``unit`` would have been as a record of its own."""
    view = Envelope()
    view.CopyFrom(unit)
    view.ClearField("items")
    view.event_id = item.event_id
    view.event_time_ms = item.event_time_ms
    view.payload = item.payload
    view.source_chain[-1].index = item.index
    return view


def item_at(envelope: Envelope, position: Position) -> Envelope:
    """The envelope of the value at ``position`` in a consumed record (a late event's).

    A late event carries its whole source record and the late value's
    position; for a unit, the value's item is the one whose index is the
    position's entry for the record's last hop. A record that is no unit
    is returned as it is.
    """
    if not envelope.items:
        return envelope
    index = position[len(envelope.source_chain)]
    for item in envelope.items:
        if item.index == index:
            return item_view(envelope, item)
    raise LookupError(f"no item {index} in the unit (position {position})")


def _template(envelope: Envelope) -> Envelope:
    """The unit without its items: what every item view starts from (one copy each)."""
    template = Envelope(key=envelope.key, payload_type=envelope.payload_type)
    chain = envelope.source_chain
    template.source_chain.extend([chain[at] for at in range(len(chain))])  # by index
    return template
