"""A pipeline's joins at start: co-partitioning checked, the merge log's topic made.

A join orders partition ``p`` of its stream with partition ``p`` of its table (one
co-partition, one merge log partition, one worker: ``JOIN_ASSIGNOR`` gives partition
``p`` of every topic to one member when the counts match). So the stream's topics
and the table must have the same partition count: a mismatch is refused at start
(``check_join_topics``: exit 2, naming both topics and counts), before any group join.
The merge log's topic (``<pipeline>-merge-log``) is created by the first worker with
the table's count (``ensure_merge_log``); a single worker whose aggregates fold several
source partitions logs their order in it too (one partition without joins).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaError

from onceflow import faults
from onceflow.actors.loop import EventLoopThread
from onceflow.kafka.merge_log_topic import KafkaMergeLog, encode_forget, merge_log_topic
from onceflow.kafka.tail_reader import tail_options
from onceflow.runtime.config import ConfigError, Settings
from onceflow.runtime.kafka_security import PLAINTEXT, KafkaSecurity, client_kwargs
from onceflow.runtime.wiring import consumer_options, producer_options
from onceflow.stages.merge_log import needs_merge_log
from onceflow.stages.pipeline import Pipeline
from onceflow.stores.fencing.held_epochs import OutputFence

log = logging.getLogger(__name__)

#: Range assignment gives partition ``p`` of every topic of equal count to the same
#: member (members sorted, the same ranges per topic): the co-assignment a join needs.
JOIN_ASSIGNOR = (RangePartitionAssignor,)
_TOPIC_ALREADY_EXISTS = 36
TIMEOUT = 10.0


class JoinPartitions(RuntimeError):
    """The joins' topics have different partition counts (permanent: no restart fixes it)."""


def join_options(options: dict[str, Any], pipeline: Pipeline) -> dict[str, Any]:
    """The consumer's options, with the co-assigning assignor when the pipeline joins."""
    return {**options, "partition_assignment_strategy": JOIN_ASSIGNOR} if pipeline.joins \
        else options


def mismatches(pipeline: Pipeline, counts: Mapping[str, int]) -> list[str]:
    """Each join whose stream topic and table topic (both existing) differ in count."""
    found = []
    for join, streams in pipeline.joins:
        table = join.table.topic
        for stream in streams:
            if stream in counts and table in counts and counts[stream] != counts[table]:
                found.append(f"join {join.id!r}: stream topic {stream!r} has {counts[stream]} "
                             f"partitions, table topic {table!r} has {counts[table]}: a join "
                             "needs the same count on both (docs/guide/joins.md)")
    return found


def check_join_topics(settings: Settings, pipeline: Pipeline) -> None:
    """A ConfigError for a join whose topics differ in partition count (one metadata
    request; a broker that does not answer is only logged, as for the side topics)."""
    if not pipeline.joins:
        return
    k = settings.kafka
    timeout = min(TIMEOUT, k.request_timeout)
    try:
        counts = asyncio.run(asyncio.wait_for(_counts(k.bootstrap_servers, k.security), timeout))
    except (KafkaError, OSError, TimeoutError) as error:
        log.warning("the broker does not answer yet (%r): the joins' partition counts are "
                    "checked when the worker starts", error)
        return
    found = mismatches(pipeline, counts)
    if found:
        raise ConfigError(settings.source, "onceflow.pipeline", "; ".join(found))


async def ensure_merge_log(bootstrap_servers: str, pipeline: Pipeline, replication_factor: int,
                           security: KafkaSecurity = PLAINTEXT, single_worker: bool = False
                           ) -> str | None:
    """Check the counts again (``JoinPartitions``) and create the merge log's topic if
    missing, with the tables' partition count (one partition for a single worker's log
    without joins); answers its name (None: no log needed, ``needs_merge_log``)."""
    if not needs_merge_log(pipeline, single_worker, None):
        return None
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs(security))
    await admin.start()
    try:
        counts = await _described(admin)
        found = mismatches(pipeline, counts)
        if found:
            raise JoinPartitions("; ".join(found))
        known = all(t in counts for t in pipeline.topics)  # a missing one: several, maybe
        sources = sum(counts[t] for t in pipeline.topics) if known else None
        if not needs_merge_log(pipeline, single_worker, sources):
            return None
        topic = merge_log_topic(pipeline.id)
        if topic not in counts:
            tables = [counts[j.table.topic] for j, _ in pipeline.joins if j.table.topic in counts]
            if pipeline.joins and not tables:
                names = [j.table.topic for j, _ in pipeline.joins]
                raise JoinPartitions(f"no table topic of {names} exists yet to take the merge "
                                     "log's partition count from")
            count = max(tables, default=1)  # a single worker's one order: partition 0
            response = await admin.create_topics([NewTopic(topic, count, replication_factor)])
            for name, code, *_ in response.topic_errors:
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise JoinPartitions(f"cannot create topic {name!r}: error {code}")
            log.info("created the merge log topic %r (%d partitions)", topic, count)
        return topic
    finally:
        await admin.close()


def open_merge_log(settings: Settings, pipeline: Pipeline, io: EventLoopThread,
                   fence: OutputFence | None, timeout: float) -> KafkaMergeLog | None:
    """The worker's merge log (None without joins, or a single worker's aggregates over
    several source partitions): its topic made if missing, each append checked against
    the epochs of its co-partition's inputs (a single worker's: of partition 0), as
    exclusive outputs are."""
    k = settings.kafka
    topic = io.run(ensure_merge_log(k.bootstrap_servers, pipeline,
                                    k.repartition_replication_factor, k.security,
                                    settings.single_worker),
                   timeout=timeout)
    if topic is None:
        return None
    inputs = sorted({*(t for _, ts in pipeline.joins for t in ts),
                     *(j.table.topic for j, _ in pipeline.joins),
                     *(pipeline.topics if settings.single_worker else ())})

    def check(partitions: list[int]) -> int:
        if fence is None or faults.NO_FENCING:
            return 0
        guard = fence.check([(topic, p) for topic in inputs for p in partitions])
        return max(guard.values(), default=0)

    return KafkaMergeLog(io, topic, producer_options(settings),
                         tail_options(consumer_options(settings)), check, timeout)


def forget_merge_log(settings: Settings, pipeline: Pipeline, topic: str, epoch: int) -> int:
    """``onceflow forget --topic``: append the forget record of ``topic`` to every partition
    of the pipeline's merge log (acks=all), so no reader replays its old runs; answers how
    many partitions (0: the pipeline keeps no merge log, or it was never created)."""
    if not needs_merge_log(pipeline, settings.single_worker, None):
        return 0
    k = settings.kafka
    log_topic = merge_log_topic(pipeline.id)

    async def append() -> int:
        partitions = (await _counts(k.bootstrap_servers, k.security)).get(log_topic, 0)
        if not partitions:
            return 0
        producer = AIOKafkaProducer(**{**producer_options(settings), "acks": "all"})
        await producer.start()
        try:
            sent = [await producer.send(log_topic, encode_forget(epoch, topic), partition=p)
                    for p in range(partitions)]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        return partitions

    return asyncio.run(asyncio.wait_for(append(), max(TIMEOUT, k.request_timeout) * 3))


async def _counts(bootstrap_servers: str, security: KafkaSecurity) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs(security))
    await admin.start()
    try:
        return await _described(admin)
    finally:
        await admin.close()


async def _described(admin: AIOKafkaAdminClient) -> dict[str, int]:
    """Every topic's partition count, from one metadata request for all topics."""
    return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics()
            if t["error_code"] == 0}
