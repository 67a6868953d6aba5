"""Dead letters and late events written once: the side outputs as exclusive outputs.

A dead letter (or late event) is produced before its record's offset is
committed, so a worker killed in between would write it again on replay.
They are kept once the way an exclusive republish is (``tail_scan``): the
side output of input partition ``p`` goes to partition ``p mod n`` of its
topic (``n`` its partition count, learned on assignment), so each input
partition has one writer there at a time, in order. Before replaying, the
worker reads that partition's tail and keeps, per input partition, the
highest position written, found in the headers: ``onceflow.pipeline`` (other
pipelines sharing the topic are read past), ``onceflow.source`` (the input
record) and ``onceflow.index`` (a late event's index among its record's late
events; a dead letter is the only one of its record: 0). The replay skips
what is at or below it.

Late decisions under replay. A value is late when the stage's watermark
has passed its window (``stages.watermark``), and the watermark depends on
how the root partitions interleave, which a replay does not repeat. So the
records after the last commit are decided afresh on replay, except those
whose late events the scan finds in the late-events topic: the scan also
keeps, per input record past its partition's committed offset, which values
(``onceflow.stage``, ``onceflow.position``) went late and at which index
(``LateMarks``), and the replay routes exactly those values late again
without producing them a second time. Every other decision of the first run
was never visible: a value it folded whose state was written is a duplicate
for the replay (the route watermarks), and one whose state was not written
is folded or found late anew, once. A fresh late event of a record gets an
index above those already written, so the skip above lets it through.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from onceflow.stages.lineage import Position
from onceflow.stages.origin import header
from onceflow.stages.outcome import ConsumedHeader, ConsumedRecord, Output
from onceflow.stages.republish import WrittenOutputs
from onceflow.stages.state import TopicPartition

PIPELINE = "onceflow.pipeline"
SOURCE = "onceflow.source"
INDEX = "onceflow.index"
#: The generation of the input's log (``lineage.root_offset``), where it is not 0: a side
#: output of the log before a forget is older than anything of the new one.
GENERATION = "onceflow.generation"
STAGE = "onceflow.stage"
POSITION = "onceflow.position"

#: A late value: its stage and its position in its root partition.
LateValue = tuple[str, Position]
#: Input partition -> input offset -> late values of that record already written, with
#: their indexes.
LateFound = dict[TopicPartition, dict[int, dict[LateValue, int]]]


def late_value(headers: Sequence[ConsumedHeader] | None) -> tuple[LateValue, int] | None:
    """The stage and position of a late event (and its index); None for a dead letter."""
    stage, position = header(headers, STAGE), header(headers, POSITION)
    if stage is None or position is None:
        return None
    try:
        return ((stage.decode(), tuple(int(part) for part in position.split(b"."))),
                int(header(headers, INDEX) or b"0"))
    except ValueError:  # UnicodeDecodeError too
        return None


def side_partition(input_partition: int, partitions: int) -> int:
    """The side-output partition of an input partition: several inputs may share one."""
    return input_partition % partitions


class SideOrigin:
    """Reads the input partition and position of a side output of ``pipeline_id``
    from its headers; None for anything else (another pipeline's, not onceflow's)."""

    def __init__(self, pipeline_id: str):
        self._pipeline = pipeline_id.encode(errors="backslashreplace")

    def __call__(self, value: bytes | None, headers: Sequence[ConsumedHeader] | None,
                 generations: Mapping[TopicPartition, int] | None = None,
                 ) -> tuple[TopicPartition, Position] | None:
        """``generations``: of the input logs forgotten at least once; an output of an
        earlier generation than its input's now is at (-1,), before anything of it."""
        if header(headers, PIPELINE) != self._pipeline:
            return None
        source = header(headers, SOURCE) or b""
        index = header(headers, INDEX) or b"0"
        try:
            topic, partition, offset = source.decode().rsplit("/", 2)
            tp = (topic, int(partition))
            written_in = int(header(headers, GENERATION) or b"0")
            if generations and written_in < generations.get(tp, 0):
                return tp, (-1,)
            return tp, (int(offset), int(index))
        except ValueError:  # UnicodeDecodeError too
            return None


class SideOutputs:
    """Places side outputs on their partitions and drops those already written.

    A topic whose partition count is unknown (no assignment scanned it: the
    testing harness, or a topic missing at the assignment) keeps Kafka's
    partitioner, written at least once as before.
    """

    def __init__(self, written: WrittenOutputs,
                 generations: Mapping[TopicPartition, int] | None = None):
        self._written = written
        #: The input logs' generations (the runner's, kept current by its ``assigned``):
        #: written with each side output of a log forgotten at least once.
        self.generations = {} if generations is None else generations
        self.partitions: dict[str, int] = {}  # topic -> partition count, from the scan
        self.skipped = 0  # outputs dropped as already written, since last taken
        self.late = LateMarks()  # late values a replay routes late again

    def placed(self, outputs: Iterable[Output], record: ConsumedRecord, first: int = 0
               ) -> Iterator[Output]:
        """``outputs`` of one record, in order (their index is ``first`` + their order),
        each on the partition its input partition maps to, less those already written."""
        generation = self.generations.get((record.topic, record.partition), 0) \
            if self.generations else 0
        for index, output in enumerate(outputs, first):
            if generation:
                output = output._replace(
                    headers=(*output.headers, (GENERATION, str(generation).encode())))
            count = self.partitions.get(output.topic)
            if count is None:
                yield output
                continue
            mark = self._written.up_to(output.topic, record)
            if mark is not None and (record.offset, index) <= mark:
                self.skipped += 1
                continue
            yield output._replace(partition=side_partition(record.partition, count))


class LateMarks:
    """The late values of records past the committed offsets that the late-events topic
    already holds (found by the scan on assignment): a replay routes them late again.

    A partition's marks go once the replay passes their highest offset.
    """

    def __init__(self) -> None:
        self._marks: LateFound = {}
        self._last: dict[TopicPartition, int] = {}

    def resume(self, found: LateFound, scanned: Iterable[TopicPartition]) -> None:
        for tp in scanned:
            self._marks.pop(tp, None)
            self._last.pop(tp, None)
        for tp, records in found.items():
            if records:
                self._marks[tp] = records
                self._last[tp] = max(records)

    def of(self, record: ConsumedRecord) -> dict[LateValue, int] | None:
        """The late values already written for ``record``; None if none."""
        if not self._marks:
            return None
        tp = (record.topic, record.partition)
        last = self._last.get(tp)
        if last is None:
            return None
        if record.offset > last:
            del self._marks[tp], self._last[tp]
            return None
        return self._marks[tp].get(record.offset)

    def __len__(self) -> int:
        return len(self._marks)
