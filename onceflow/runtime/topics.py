"""Creates a pipeline's repartition topics before its consumer subscribes to them.

A repartition topic is the pipeline's own: the worker that starts first
creates it with the declared partition count (default: as many as the source
topic with the most), and every worker, including one that lost the race to
create it, uses what the broker has. Its partition count must not change
afterwards: keys would move to other partitions, and the key-home check then
dead-letters their records rather than fold them on two workers.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from onceflow.runtime.kafka_security import PLAINTEXT, KafkaSecurity, client_kwargs
from onceflow.stages.pipeline import Pipeline

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36


class TopicSetupError(RuntimeError):
    """A repartition topic could not be created; the supervisor retries the start."""


async def ensure_repartition_topics(
    bootstrap_servers: str, pipeline: Pipeline, replication_factor: int,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, int]:
    """Create the missing repartition topics; answer every one's partition count."""
    if not pipeline.repartitions:
        return {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs(security))
    await admin.start()
    try:
        counts = await _partition_counts(admin)
        missing = [hop for hop in pipeline.repartitions if hop.topic not in counts]
        if missing:
            sources = [counts[t] for t in pipeline.topics if t in counts]
            new = []
            for hop in missing:
                partitions = hop.partitions or max(sources, default=0)
                if not partitions:
                    raise TopicSetupError(
                        f"repartition {hop.id!r}: no source topic of {pipeline.topics} exists "
                        "yet to take the partition count from; declare partitions=")
                new.append(NewTopic(hop.topic, partitions, replication_factor))
            response = await admin.create_topics(new)
            for topic, code, *_ in response.topic_errors:
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise TopicSetupError(f"cannot create topic {topic!r}: error {code}")
            log.info("created repartition topics %s", {t.name: t.num_partitions for t in new})
            counts = await _partition_counts(admin)
        for hop in pipeline.repartitions:
            if hop.partitions not in (None, counts.get(hop.topic, hop.partitions)):
                log.warning("repartition topic %r has %s partitions, the pipeline declares %d: "
                            "using the topic as it is", hop.topic, counts.get(hop.topic),
                            hop.partitions)
        return {hop.topic: counts.get(hop.topic, 0) for hop in pipeline.repartitions}
    finally:
        await admin.close()


async def _partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    """Every topic's partition count, from one metadata request for all topics.

    Asking for all topics (not by name) never makes a broker auto-create one.
    """
    return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics()
            if t["error_code"] == 0}
