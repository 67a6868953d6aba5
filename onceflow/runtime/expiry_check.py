"""Warns at start when states may expire before the input they were folded from is gone.

An expired state takes its watermarks with it (``onceflow.state.expire-after``, an
aggregate's ``expire_after``), so a replay of events older than the expiry (a group reset
to the earliest offset, a consumer far behind) would fold them again. The rule is that
the expiry exceeds the input topics' retention, or the longest replay allowed. The worker
reads each consumed topic's ``retention.ms`` (one DescribeConfigs request) and warns for
a topic that keeps records longer (``-1``: forever) than a stage's expiry. A warning only:
the rule may rest on replays the operator never allows. A broker that does not answer, or
does not report the setting (the embedded test broker reports only settings set on the
topic), is logged as not checked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from onceflow.runtime.config import Settings
from onceflow.runtime.kafka_security import client_kwargs
from onceflow.stages.pipeline import Pipeline

__all__ = ["check_retention", "expiries", "too_short"]

log = logging.getLogger(__name__)

RETENTION = "retention.ms"
TIMEOUT = 10.0  # longest the check waits for the broker (at most the request timeout)


def expiries(settings: Settings, pipeline: Pipeline) -> dict[str, float]:
    """Stage id -> seconds after which its states expire, for the stages whose states do
    (an aggregate's own ``expire_after`` wins over ``onceflow.state.expire-after``)."""
    found = {}
    for spec in pipeline.aggregates:
        seconds = settings.state.expire_after if spec.expire_after is None \
            else spec.expire_after
        if seconds:
            found[spec.id] = seconds
    return found


def too_short(expiring: Mapping[str, float], retentions: Mapping[str, int | None]
              ) -> list[tuple[str, str, int]]:
    """(stage, topic, retention ms) for each stage that expires before the topic's records
    do (a retention of -1 keeps them forever); topics whose retention is unknown are left
    out."""
    found = []
    for topic, ms in sorted(retentions.items()):
        if ms is None:
            continue
        for stage, seconds in expiring.items():
            if ms < 0 or ms > seconds * 1000:
                found.append((stage, topic, ms))
    return found


def check_retention(settings: Settings, pipeline: Pipeline) -> None:
    """Log each stage's expiry, and warn where a consumed topic keeps records longer."""
    expiring = expiries(settings, pipeline)
    if not expiring:
        return
    log.info("states expire after %s (seconds without a fold, per stage)", expiring)
    topics = pipeline.consumed_topics
    timeout = min(TIMEOUT, settings.kafka.request_timeout)
    try:
        retentions = asyncio.run(asyncio.wait_for(_retentions(settings, topics, timeout),
                                                  timeout))
    except (KafkaError, OSError, TimeoutError, ValueError, TypeError, IndexError) as error:
        log.info("state expiry not checked against the topics' retention: reading "
                 "retention.ms of %s failed (%r)", ", ".join(topics), error)
        return
    for stage, topic, ms in too_short(expiring, retentions):
        kept = "forever" if ms < 0 else f"{ms / 1000:g}s"
        log.warning("stage %r: states expire after %gs, but topic %r keeps records %s "
                    "(retention.ms %d): a replay of records older than the expiry would "
                    "fold them again; raise expire_after above the retention, or never "
                    "replay that far (docs/guide/pipelines-and-steps.md, State expiry)",
                    stage, expiring[stage], topic, kept, ms)
    unknown = [topic for topic in topics if retentions.get(topic) is None]
    if unknown:
        log.info("state expiry not checked against %s: the broker did not report their "
                 "retention.ms", ", ".join(unknown))


async def _retentions(settings: Settings, topics: Iterable[str], timeout: float
                      ) -> dict[str, int | None]:
    """Each topic's ``retention.ms`` as the broker reports it; None where it does not."""
    k = settings.kafka
    admin = AIOKafkaAdminClient(bootstrap_servers=k.bootstrap_servers,
                                request_timeout_ms=int(timeout * 1000),
                                **client_kwargs(k.security))
    found: dict[str, int | None] = dict.fromkeys(topics)
    try:
        await admin.start()
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {RETENTION: None})
             for topic in found])
    finally:
        await admin.close()
    for response in responses:
        for error_code, _, _, name, entries, *_ in response.resources:
            if error_code == 0 and name in found:
                for entry in entries:
                    if entry[0] == RETENTION and entry[1] is not None:
                        found[name] = int(entry[1])
    return found
