"""The log marks of a pipeline without a store: a compacted topic of its own.

A stateless republisher keeps no store, so nothing held its log marks
(``checkpoint.log_marks``) and a re-created input topic went unseen: the group's
offsets went with the old topic, the worker read the new one from 0, and its
outputs carried the old records' source chains, so the aggregates downstream
discarded every one as a copy. Here the marks go to ``<pipeline>-log-marks``
(one partition, compacted: ``TOPIC_CONFIGS``), created by the first worker:
record key = the mark's row key (``topic|partition``), value = the encoded mark
(or ``NO_MARK``, left by ``onceflow forget``, beside its ``topic|partition|generation``
row). Loading reads the partition to its
end (``topic_end.read_records``) and keeps each key's last value; saving produces
one record per partition a snapshot advanced (acks=all) and waits for them.

Per snapshot, not per record: the record path is unchanged (the consumer takes a
mark per partition and batch for every pipeline). No epochs guard these writes
(a store-less pipeline has none): a late write of a paused worker names a record
of the same log, which the check accepts all the same. A broker that does not
compact the topic makes the read at each assignment grow with the snapshots.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from onceflow.actors.loop import EventLoopThread
from onceflow.kafka.topic_end import read_records
from onceflow.stages.declarations import LOGS_STAGE
from onceflow.stores.fencing import Guard

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
PARTITION = 0  # the topic's one partition: the last write of a key is the last in it
#: Compacted, its segments rolled hourly: Kafka compacts only closed segments (a week's
#: by default), and the whole topic is read at each assignment.
TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.ms": "3600000"}


class MarksTopicError(RuntimeError):
    """The marks topic could not be created; the supervisor retries the start."""


def log_marks_topic(pipeline_id: str) -> str:
    """The log marks' topic of a pipeline without a store."""
    return f"{pipeline_id}-log-marks"


async def ensure_log_marks_topic(admin: AIOKafkaAdminClient, topic: str,
                                 replication_factor: int) -> None:
    """Create ``topic`` (one partition, compacted) unless it exists."""
    if topic in await admin.list_topics():
        return
    response = await admin.create_topics([NewTopic(
        topic, 1, replication_factor, topic_configs=TOPIC_CONFIGS)])
    for name, code, *_ in response.topic_errors:
        if code not in (0, _TOPIC_ALREADY_EXISTS):
            raise MarksTopicError(f"cannot create topic {name!r}: error {code}")
    log.info("created the log marks topic %r", topic)


def last_values(records: Sequence[Any]) -> dict[str, bytes]:
    """Each key's last value, in log order (a tombstone drops the key)."""
    rows: dict[str, bytes] = {}
    for record in records:
        if record.key is None:
            continue
        key = record.key.decode()
        if record.value is None:
            rows.pop(key, None)
        else:
            rows[key] = record.value
    return rows


class KafkaLogMarks:
    """``MarkRows`` over ``topic``, on the loop ``io``: blocking calls from any other
    thread (persistence's, an executor's), the clients on the loop."""

    def __init__(self, io: EventLoopThread, topic: str, producer_options: Mapping[str, Any],
                 consumer_options: Mapping[str, Any], timeout: float):
        self._io, self.topic, self._timeout = io, topic, timeout
        self._consumer_options = {k: v for k, v in consumer_options.items()
                                  if k not in ("group_id", "partition_assignment_strategy")}
        self._producer = io.run(_open({**producer_options, "acks": "all"}), timeout=timeout)

    def rows(self) -> dict[str, bytes]:
        """Every mark row: the topic read to its end, each key's last value."""
        read = self._io.run(read_records(self._consumer_options, self.topic, [PARTITION],
                                         self._timeout * 2), timeout=self._timeout * 3)
        return last_values(read[PARTITION][0])

    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        _only_marks(stage_id)
        rows = self.rows()
        return {key: rows[key] for key in keys if key in rows}

    def save(self, stage_id: str, rows: Mapping[str, bytes], *,
             guard: Guard | None = None) -> None:
        """Produce each row and wait for every acknowledgement (``guard``: none is held
        without a store; see the module doc)."""
        _only_marks(stage_id)
        self._io.run(self._send(rows), timeout=self._timeout)

    def close(self) -> None:
        self._io.run(self._producer.stop(), timeout=self._timeout)

    async def _send(self, rows: Mapping[str, bytes]) -> None:
        sent = [await self._producer.send(self.topic, row, key=key.encode(),
                                          partition=PARTITION)
                for key, row in sorted(rows.items())]
        await asyncio.gather(*sent)


def _only_marks(stage_id: str) -> None:
    if stage_id != LOGS_STAGE:
        raise ValueError(f"the log marks topic holds stage {LOGS_STAGE!r} only, not "
                         f"{stage_id!r}")


async def _open(options: Mapping[str, Any]) -> AIOKafkaProducer:
    """A producer made on the loop (aiokafka binds it to the running loop)."""
    producer = AIOKafkaProducer(**options)
    await producer.start()
    return producer
