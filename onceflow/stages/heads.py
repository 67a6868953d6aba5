"""A consumed record's head: parsed in its topic's format, producer duplicates dropped,
its origin found and its value decoded, before any step of its segment runs.

Both of the runner's paths start here (``runner.PipelineRunner._plan`` and the
fused ``single_fold.FoldSegment``).
"""

from __future__ import annotations

from collections.abc import Iterable

from onceflow.stages import unit_wire
from onceflow.stages.formats import Reader, hop_reader, itself, meta_of, source_reader
from onceflow.stages.guards import check_chain, check_header_names
from onceflow.stages.lineage import Position, chain_origin, origin_of_hops
from onceflow.stages.origin import chain_envelope
from onceflow.stages.outcome import ConsumedRecord, StageFailure
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.plan import Head
from onceflow.stages.producer_dedup import PartitionSequences, SequenceTables
from onceflow.stages.state import TopicPartition
from onceflow.stages.unit_wire import WireEnvelope, read_envelope
from onceflow.stages.units import expand, out_of_order, unit_of

#: Whether a record of one value is read off the wire too, not only a unit: where
#: ``unit_wire`` runs compiled, its reader takes about half the time of protobuf's parse and
#: field reads (``FromString``, the chain's hops, ``items``); in pure Python it takes twice
#: theirs (journal 2026-11-27, issue 30). A unit is read off the wire either way: through
#: protobuf, each of its items would be read field by field.
PLAIN_OFF_THE_WIRE = not unit_wire.__file__.endswith(".py")


class Heads:
    """The readers of a pipeline's consumed topics (sources and repartition hops)."""

    def __init__(self, pipeline: Pipeline, sequences: SequenceTables | None,
                 without_envelope: Iterable[str] = (), plain: bool = PLAIN_OFF_THE_WIRE):
        """``without_envelope``: topics whose steps never read a record's envelope (no
        republish step); their units (and, with ``plain``, their other envelopes) are read
        off the wire (``unit_wire``) where their decoder reads only the payload."""
        self._plain = plain
        self._readers = {topic: source_reader(topic, pipeline.format_of(topic), pipeline.decode,
                                              pipeline.with_meta) for topic in pipeline.topics}
        self._readers.update({hop.topic: hop_reader(hop.topic, hop.decode)
                              for hop in pipeline.repartitions})
        self._first = self._readers[pipeline.topics[0]]
        self.sequences = sequences
        envelopes = {*(t for t in pipeline.topics if pipeline.format_of(t) == "envelope"),
                     *(hop.topic for hop in pipeline.repartitions)}
        self._wire_topics = {topic for topic in without_envelope if topic in envelopes
                             and self._readers[topic].payload is not None
                             and not self._readers[topic].with_meta}

    def __call__(self, record: ConsumedRecord, fed_from: TopicPartition, offset: int,
                 table: PartitionSequences | None) -> Head | None:
        """Parse, producer dedup, origin and decode: the record's first values (one, or a
        unit's items) and their positions (parallel lists); None for a producer duplicate.
        ``fed_from`` and ``offset``: the record's, read once by the caller; ``table``: its
        partition's producer sequences (``SequenceTables.table_of``), if it has them."""
        reader: Reader = self._readers.get(fed_from[0]) or self._first
        headers = record.headers
        if headers:
            check_header_names(headers)
        if table is None and fed_from[0] in self._wire_topics:
            data = record.value
            wire = read_envelope(data, self._plain) if type(data) is bytes else None
            if wire is not None:
                head = _wire_head(wire, reader, fed_from, offset)
                if head is not None:
                    return head
        value, envelope = reader.parse(record)  # FormatError: a dead letter naming the formats
        if envelope is None and headers:  # a plain output of another onceflow step: its chain
            envelope = chain_envelope(record.key, record.timestamp, headers)
        if envelope is None or not (chain := envelope.source_chain):  # its own root
            root = route = fed_from
            position: Position = (offset,)
        else:
            root, route, position = chain_origin(chain)
            check_chain(len(chain), root, position, fed_from, offset)
        # several values (stages.units), checked; ``not items`` first: ``list`` of an empty
        # upb repeated field raises and catches an IndexError (``lineage.hops_of``)
        unit = None if envelope is None or not envelope.items else unit_of(envelope)
        if table is not None and self.sequences is not None and \
                not self.sequences.admit(table, record, value):
            return None
        try:
            if unit is not None:  # as if its items came one record each
                assert envelope is not None
                return (envelope, root, route, *expand(reader, envelope, unit, record,
                                                       position))
            if reader.decode is not itself:
                value = reader.decode(value)
        except Exception as error:
            raise StageFailure("decode", error) from error
        return (envelope, root, route,
                [(value, meta_of(record, envelope)) if reader.with_meta else value], [position])


def _wire_head(wire: WireEnvelope, reader: Reader, fed_from: TopicPartition, offset: int
               ) -> Head | None:
    """``Heads.__call__`` of an envelope read off the wire, for a topic whose steps take only
    its payloads (no envelope: none of them reads it); None where it is a unit that
    ``unit_of`` refuses, so that protobuf's path refuses it in its words."""
    chain, indexes, payloads, payload = wire
    if chain:
        root, route, position = origin_of_hops(chain)
        check_chain(len(chain), root, position, fed_from, offset)
    elif indexes:  # a unit without a chain
        return None
    else:  # its own root
        root = route = fed_from
        position = (offset,)
    fast = reader.payload
    assert fast is not None
    if not indexes:  # one value
        try:
            value = fast(payload)
        except Exception as error:
            raise StageFailure("decode", error) from error
        return None, root, route, [value], [position]
    if out_of_order(indexes) is not None:
        return None
    base = position[:-1]
    positions = [base + (index,) for index in indexes]  # noqa: RUF005 (as units.expand)
    try:
        values = [fast(item) for item in payloads]
    except Exception as error:
        raise StageFailure("decode", error) from error
    return None, root, route, values, positions
