"""Where an exclusive republish resumes: what its output partitions already hold.

Pure logic; ``onceflow.kafka.tail_reader`` does the Kafka reading. An
exclusive republish step is the one writer of its output partitions (each is
fed by the input partitions its partition map sends there, and the worker
that owns those inputs writes it). Its outputs carry their input's position
(the last hop of the source chain: input topic, partition, offset, fan-out
index), and one writer keeps them in order per partition (a lane, and the
resume below). So after a crash, before replaying an input partition from
its committed offset, the worker reads the output partition backwards from
its end and keeps, per input partition it owns, the highest position found;
the replay then skips every output at or below it.

The scan of an input partition ends at the first record of it found below
its committed offset (everything older is older still, and the replay starts
at the commit anyway), so it reads about one commit interval of outputs. An
input partition with no output after its commit ends at its newest output,
however far back; with no output at all, the scan reads to the partition's
start. Records of other roots (input partitions owned by other workers, or
that this worker does not own) are read past.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.stages.formats import is_marked
from onceflow.stages.lineage import Position, split_root_offset
from onceflow.stages.origin import CHAIN_HEADER, decode_chain, header
from onceflow.stages.outcome import ConsumedHeader
from onceflow.stages.state import TopicPartition

#: Input partition -> the highest (offset, fan-out index) already written for it.
Written = dict[TopicPartition, Position]
#: Where a record of an output came from: (value, headers) -> input partition and position.
Origin = Callable[[bytes | None, Sequence[ConsumedHeader] | None],
                  tuple[TopicPartition, Position] | None]


class LogOrigin(Protocol):
    """An ``Origin`` that reads positions in the input logs' generations (those forgotten
    at least once, ``lineage.root_offset``): ``written_origin``, ``SideOrigin``."""

    def __call__(self, value: bytes | None, headers: Sequence[ConsumedHeader] | None,
                 generations: Mapping[TopicPartition, int] | None = None,
                 ) -> tuple[TopicPartition, Position] | None: ...


def written_origin(value: bytes | None, headers: Sequence[ConsumedHeader] | None,
                   generations: Mapping[TopicPartition, int] | None = None,
                   ) -> tuple[TopicPartition, Position] | None:
    """The input partition and position a onceflow output came from: the last hop of its
    chain (the ``onceflow-chain`` header of a plain output, or the envelope's chain), with
    the hop before's index (the input's own: which item of an input unit) if there is
    one. None for a record onceflow did not write.

    A one-hop chain's hop is its root, written at its offset in the root log's generation
    (``lineage.root_offset``): read back in ``generations`` (0 if not there), an output of
    an earlier generation (the log before a forget) is older than anything of this one,
    at (-1,)."""
    text = header(headers, CHAIN_HEADER)
    chain: Sequence[SourceRef]
    if text:
        try:
            chain = decode_chain(text)
        except ValueError:
            return None
    elif is_marked(headers):
        try:
            chain = Envelope.FromString(value or b"").source_chain
        except DecodeError:
            return None
    else:
        return None
    if not chain:
        return None
    hop = chain[-1]
    if len(chain) == 1:
        tp = (hop.topic, hop.partition)
        generation, offset = split_root_offset(hop.offset)
        if generation != (generations or {}).get(tp, 0):
            return tp, (-1,)
        return tp, (offset, hop.index)
    # The input's own last index too: an input unit's items each count j from 0.
    return (hop.topic, hop.partition), (hop.offset, chain[-2].index, hop.index)


@dataclass
class TailScan:
    """The backward scan of one output partition.

    ``committed``: each input partition mapped here that this worker owns,
    with the offset its replay starts at (-1 when unknown: the scan of it
    then ends at its newest output). Feed it chunks newest first; each chunk
    in any order. ``origin`` reads a record's input position (dead letters and
    late events carry theirs in other headers: ``side_outputs.SideOrigin``).
    """

    committed: Mapping[TopicPartition, int]
    origin: Origin = written_origin
    written: Written = field(default_factory=dict)
    open: set[TopicPartition] = field(default_factory=set)
    #: Late events past the committed offsets (``side_outputs.LateMarks``), when
    #: ``late_of`` reads them.
    late_of: Callable[[Sequence[ConsumedHeader] | None], Any] | None = None
    late: dict[TopicPartition, dict[int, dict[Any, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.open = set(self.committed)

    def feed(self, records: Iterable[tuple[bytes | None, Sequence[ConsumedHeader] | None]]) -> None:
        """One chunk of (value, headers); chunks newest first."""
        settled = set()
        for value, headers in records:
            found = self.origin(value, headers)
            if found is None or found[0] not in self.committed:
                continue
            tp, position = found
            if position > self.written.get(tp, (-1,)):
                self.written[tp] = position
            start = self.committed[tp]
            if self.late_of is not None and 0 <= start <= position[0]:
                late = self.late_of(headers)
                if late is not None:
                    self.late.setdefault(tp, {}).setdefault(position[0], {})[late[0]] = late[1]
            if start < 0 or position[0] < start:
                settled.add(tp)
        self.open -= settled

    @property
    def done(self) -> bool:
        return not self.open


def windows(low: int, high: int, size: int) -> Iterator[tuple[int, int]]:
    """Offset ranges [start, end) from ``high`` back to ``low``, ``size`` at a time."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    end = high
    while end > low:
        start = max(low, end - size)
        yield start, end
        end = start


def merge(*found: Written) -> Written:
    """The highest position per input partition over several sources (tail, pending sends)."""
    merged: Written = {}
    for written in found:
        for tp, position in written.items():
            if position > merged.get(tp, (-1,)):
                merged[tp] = position
    return merged
