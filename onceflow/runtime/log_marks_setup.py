"""A store-less pipeline's log marks topic at start, and ``onceflow forget``'s part in it.

A pipeline with a store keeps its log marks there (``checkpoint.log_marks``); one
without (a stateless republisher) keeps them in ``<pipeline>-log-marks``
(``kafka.log_marks_topic``), made by the first worker like the merge log's topic.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient

from onceflow.actors.loop import EventLoopThread
from onceflow.checkpoint.log_marks import forgotten_rows
from onceflow.kafka.log_marks_topic import KafkaLogMarks, ensure_log_marks_topic, log_marks_topic
from onceflow.kafka.tail_reader import tail_options
from onceflow.runtime.config import Settings
from onceflow.runtime.kafka_security import client_kwargs
from onceflow.runtime.wiring import consumer_options, producer_options
from onceflow.stages.declarations import LOGS_STAGE
from onceflow.stages.pipeline import Pipeline

log = logging.getLogger(__name__)


def open_log_marks(settings: Settings, pipeline: Pipeline, io: EventLoopThread,
                   timeout: float) -> KafkaLogMarks:
    """The marks topic of a pipeline without a store, created if missing."""
    k = settings.kafka
    topic = log_marks_topic(pipeline.id)

    async def ensure() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=k.bootstrap_servers,
                                    **client_kwargs(k.security))
        await admin.start()
        try:
            await ensure_log_marks_topic(admin, topic, k.repartition_replication_factor)
        finally:
            await admin.close()

    io.run(ensure(), timeout=timeout)
    return KafkaLogMarks(io, topic, producer_options(settings),
                         tail_options(consumer_options(settings)), timeout)


def forget_log_marks(settings: Settings, pipeline: Pipeline, topic: str) -> dict[str, bytes]:
    """``onceflow forget --topic`` for a pipeline without a store: ``NO_MARK`` and the next
    generation for each of ``topic``'s partitions holding a mark
    (``log_marks.forgotten_rows``); answers the rows written (none: the topic holds no
    mark of it)."""
    timeout = settings.kafka.request_timeout + 10
    io = EventLoopThread("onceflow-forget")
    try:
        marks = open_log_marks(settings, pipeline, io, timeout)
        try:
            rows = forgotten_rows(marks.rows(), topic)
            if rows:
                marks.save(LOGS_STAGE, rows)
        finally:
            marks.close()
    finally:
        io.stop()
    log.warning("forget %s: pipeline %r, log marks topic %s: %d partitions' marks dropped, "
                "their logs' generations counted up (%s)", topic, pipeline.id, marks.topic,
                len(rows) // 2, sorted(rows))
    return rows
