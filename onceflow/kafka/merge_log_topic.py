"""The merge log of a worker: a Kafka topic, partition ``p`` for co-partition ``p``.

``stages.merge_log`` decides what is logged and replayed; this writes and reads it.
Each record is one append: ``{"e": epoch, "r": [[topic, first, last], ...]}`` (a single
worker's runs name their partition: ``[topic, first, last, partition]``), produced
and acknowledged (acks=all) before the runs it lists are applied. One writer per
partition: the member that owns co-partition ``p`` (the co-assignment), and like an
exclusive output (docs/architecture.md, "Fencing") each append is checked against the
epochs in the store first (``check``; fenced, it raises and the core fails). A zombie's
append that lands after its successor took the partition carries an older epoch than
the successor's: the reader drops every record whose epoch is below one it read before,
and every one of a lower epoch at or past the mark a successor writes right after it
read the log (``decode_all``).
``onceflow forget --topic T`` appends ``{"e": epoch, "r": [], "f": T}`` to every partition
(``encode_forget``): T was re-created, its offsets start over, and its runs logged before
it order nothing (a replay would wait for records below T's new positions for ever).
A reader starts where the runner's ``LogStarts`` said the last snapshot's committed
offsets allow (``stages.merge_log.Start``, kept in the store), not at the partition's
start: what is read at an assignment is bounded by what was not committed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer

from onceflow.actors.loop import EventLoopThread
from onceflow.kafka.topic_end import read_to_end as read_to_end  # reconcile reads it here
from onceflow.stages.merge_log import Append, Logged, Run, Start, kept_appends

log = logging.getLogger(__name__)

#: Answers the epoch this worker holds for co-partitions ``ps``, checked against the store
#: (raises ``Fenced`` when another member took one over); 0 without fencing.
EpochCheck = Callable[[list[int]], int]


def merge_log_topic(pipeline_id: str) -> str:
    """The merge log's topic of a pipeline."""
    return f"{pipeline_id}-merge-log"


def encode(epoch: int, runs: list[Run], after: int | None = None) -> bytes:
    """An append; with ``after``, a reader's mark: the log as read ended before offset
    ``after``, and nothing of a lower epoch from there on counts."""
    doc: dict[str, Any] = {"e": epoch, "r": [list(run) if run.partition is not None
                                             else list(run[:3]) for run in runs]}
    if after is not None:
        doc["a"] = after
    return json.dumps(doc, separators=(",", ":")).encode()


def encode_forget(epoch: int, topic: str) -> bytes:
    """``onceflow forget --topic``'s record: ``topic``'s runs logged before it are dropped.
    ``epoch``: at least every epoch taken so far (not skipped as a zombie's)."""
    return json.dumps({"e": epoch, "r": [], "f": topic}, separators=(",", ":")).encode()


def decode_all(records: list[tuple[int, bytes]]) -> list[Run]:
    """The runs of a partition's (offset, value) records in order (``decode_appends``)."""
    return [run for append in decode_appends(records) for run in append.runs]


def decode_appends(records: list[tuple[int, bytes]], highest: int = 0) -> list[Append]:
    """A partition's (offset, value) records as appends in order, as ``kept_appends``
    keeps them (a zombie's late appends and the runs of a forgotten topic dropped). A
    record that is no append is skipped with a warning."""
    return kept_appends(_parsed(records), highest)


def _parsed(records: list[tuple[int, bytes]]) -> Iterator[Logged]:
    for offset, value in records:
        try:
            doc = json.loads(value)
            epoch = int(doc["e"])
            runs = [Run(str(t), int(a), int(b), int(p[0]) if p else None)
                    for t, a, b, *p in doc["r"]]
            after = None if doc.get("a") is None else int(doc["a"])
            forgotten = doc.get("f")
        except (ValueError, TypeError, KeyError) as error:
            log.warning("merge log: a record that is no append skipped: %r", error)
            continue
        yield Logged(offset, epoch, runs, after, forgotten)


class KafkaMergeLog:
    """``MergeLog`` over the topic ``topic``, on the core's loop ``io``."""

    def __init__(self, io: EventLoopThread, topic: str, producer_options: Mapping[str, Any],
                 consumer_options: Mapping[str, Any], check: EpochCheck, timeout: float):
        self._io, self._topic, self._check, self._timeout = io, topic, check, timeout
        self._consumer_options = {k: v for k, v in consumer_options.items()
                                  if k not in ("group_id", "partition_assignment_strategy")}
        self._producer = io.run(self._open({**producer_options, "acks": "all"}),
                                timeout=timeout)

    def append(self, runs: Mapping[int, list[Run]]) -> dict[int, Append]:
        """Produce one append per co-partition and wait for every acknowledgement (from the
        pipeline thread): one epoch check and one round trip for the batch."""
        epoch = self._check(sorted(runs))
        offsets = self._io.run(self._send(runs, epoch), timeout=self._timeout)
        return {p: Append(offsets[p], epoch, list(logged)) for p, logged in runs.items()}

    async def _send(self, runs: Mapping[int, list[Run]], epoch: int) -> dict[int, int]:
        sent = [await self._producer.send(self._topic, encode(epoch, logged), partition=p)
                for p, logged in runs.items()]
        acked = await asyncio.gather(*sent)
        return {p: meta.offset for p, meta in zip(runs, acked, strict=True)}

    def read(self, partition: int, start: Start | None = None) -> list[Append]:
        """The appends of ``partition`` from ``start`` on (from the pipeline thread), then
        this reader's mark at the end it read (``encode``'s ``after``): a zombie's append
        landing later no longer counts."""
        records, end = self._io.run(self._read(partition, 0 if start is None else start.offset),
                                    timeout=self._timeout * 3)
        if start is not None and end < start.offset:  # the log restarted below the start
            log.warning("merge log %s[%d] ends at %d, below where it was to be read from "
                        "(%d): the topic was re-created; reading it whole", self._topic,
                        partition, end, start.offset)
            start = None
            records, end = self._io.run(self._read(partition, 0), timeout=self._timeout * 3)
        epoch = self._check([partition])
        self._io.run(self._producer.send_and_wait(self._topic, encode(epoch, [], end),
                                                  partition=partition), timeout=self._timeout)
        log.info("merge log %s[%d] read from offset %d to %d (%d records)", self._topic,
                 partition, 0 if start is None else start.offset, end, len(records))
        return decode_appends(records, 0 if start is None else start.epoch)

    def close(self) -> None:
        self._io.run(self._producer.stop(), timeout=self._timeout)

    @staticmethod
    async def _open(options: Mapping[str, Any]) -> AIOKafkaProducer:
        """A producer made on the loop (aiokafka binds it to the running loop)."""
        producer = AIOKafkaProducer(**options)
        await producer.start()
        return producer

    async def _read(self, partition: int, start: int) -> tuple[list[tuple[int, bytes]], int]:
        """The partition's records from ``start`` and the high watermark it was read to."""
        return (await read_to_end(self._consumer_options, self._topic, [partition],
                                  self._timeout * 2, {partition: start}))[partition]
