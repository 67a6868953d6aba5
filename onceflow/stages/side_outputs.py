"""Dead letters and late events written once: the side outputs as exclusive outputs.

A dead letter (or late event) is produced before its record's offset is
committed, so a worker killed in between would write it again on replay.
They are kept once the way an exclusive republish is (``output_tail``): the
side output of input partition ``p`` goes to partition ``p mod n`` of its
topic (``n`` its partition count, learned on assignment), so each input
partition has one writer there at a time, in order. Before replaying, the
worker reads that partition's tail and keeps, per input partition, the
highest position written, found in the headers: ``onceflow.pipeline`` (other
pipelines sharing the topic are read past), ``onceflow.source`` (the input
record) and ``onceflow.index`` (a late event's index among its record's late
events; a dead letter is the only one of its record: 0). The replay skips
what is at or below it.

Why an index and not the value's position: a replay may produce fewer late
events of a record (an aggregate persisted past it), never others; states
are written only after their records' outputs are settled, so when one
aggregate is past a record, all of that record's late events are written
and any subset of indexes is at or below the mark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from onceflow.stages.lineage import Position
from onceflow.stages.origin import Header, header
from onceflow.stages.outcome import ConsumedRecord, Output
from onceflow.stages.republish import WrittenOutputs
from onceflow.stages.state import TopicPartition

PIPELINE = "onceflow.pipeline"
SOURCE = "onceflow.source"
INDEX = "onceflow.index"


def side_partition(input_partition: int, partitions: int) -> int:
    """The side-output partition of an input partition: several inputs may share one."""
    return input_partition % partitions


class SideOrigin:
    """Reads the input partition and position of a side output of ``pipeline_id``
    from its headers; None for anything else (another pipeline's, not onceflow's)."""

    def __init__(self, pipeline_id: str):
        self._pipeline = pipeline_id.encode(errors="backslashreplace")

    def __call__(self, value: bytes | None, headers: Sequence[Header] | None
                 ) -> tuple[TopicPartition, Position] | None:
        if header(headers, PIPELINE) != self._pipeline:
            return None
        source = header(headers, SOURCE) or b""
        index = header(headers, INDEX) or b"0"
        try:
            topic, partition, offset = source.decode().rsplit("/", 2)
            return (topic, int(partition)), (int(offset), int(index))
        except ValueError:  # UnicodeDecodeError too
            return None


class SideOutputs:
    """Places side outputs on their partitions and drops those already written.

    A topic whose partition count is unknown (no assignment scanned it: the
    testing harness, or a topic missing at the assignment) keeps Kafka's
    partitioner, written at least once as before.
    """

    def __init__(self, written: WrittenOutputs):
        self._written = written
        self.partitions: dict[str, int] = {}  # topic -> partition count, from the scan
        self.skipped = 0  # outputs dropped as already written, since last taken

    def placed(self, outputs: Iterable[Output], record: ConsumedRecord) -> Iterator[Output]:
        """``outputs`` of one record, in order (their index is their order), each on the
        partition its input partition maps to, less those already written."""
        for index, output in enumerate(outputs):
            count = self.partitions.get(output.topic)
            if count is None:
                yield output
                continue
            mark = self._written.up_to(output.topic, record)
            if mark is not None and (record.offset, index) <= mark:
                self.skipped += 1
                continue
            yield output._replace(partition=side_partition(record.partition, count))
