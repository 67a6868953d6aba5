"""Checks, before any actor starts, that the topics the worker writes its side outputs to
exist on the broker.

A dead-letter topic (or, for a pipeline with windows, a late-events topic)
named in the configuration that the broker does not have is a ConfigError:
the worker exits 2 naming the key, the topic and the broker, before it joins
its group. Without the check a typo in the name went unseen: a broker that
creates topics on first use made a new topic nobody reads, one that does not
held every commit behind the first dead letter. The default names are not
checked: they are left to the broker's creation on first use, as before.

One metadata request for all topics (asking by name would make such a broker
create the topic). A broker that does not answer in time is only logged: the
worker starts and retries it, as at any outage.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from onceflow.runtime.config import ConfigError, Settings, reference_default
from onceflow.runtime.kafka_security import client_kwargs
from onceflow.stages.pipeline import Pipeline

__all__ = ["check_side_topics", "side_topics"]

log = logging.getLogger(__name__)

DEAD_LETTER_KEY = "onceflow.kafka.dead-letter-topic"
LATE_EVENTS_KEY = "onceflow.kafka.late-events-topic"
TIMEOUT = 10.0  # longest the check waits for the broker (at most the request timeout)


def side_topics(settings: Settings, pipeline: Pipeline) -> dict[str, str]:
    """Config key -> topic, for the side outputs the pipeline writes whose names were set
    (not the defaults)."""
    k = settings.kafka
    named = {DEAD_LETTER_KEY: k.dead_letter_topic}
    if any(spec.window is not None for spec in pipeline.aggregates):
        named[LATE_EVENTS_KEY] = k.late_events_topic
    return {key: topic for key, topic in named.items() if topic != reference_default(key)}


def check_side_topics(settings: Settings, pipeline: Pipeline) -> None:
    """A ConfigError for the first named side-output topic the broker does not have."""
    wanted = side_topics(settings, pipeline)
    if not wanted:
        return
    k = settings.kafka
    timeout = min(TIMEOUT, k.request_timeout)
    try:
        existing = asyncio.run(asyncio.wait_for(_topics(settings, timeout), timeout))
    except (KafkaError, OSError, TimeoutError) as error:
        log.warning("the broker at %s does not answer yet (%r): starting without checking "
                    "the topics %s; the start retries it", k.bootstrap_servers, error,
                    ", ".join(map(repr, wanted.values())))
        return
    for key, topic in wanted.items():
        if topic not in existing:
            raise ConfigError(settings.source, key,
                              f"expected an existing topic, {topic!r} does not exist on "
                              f"{k.bootstrap_servers}")


async def _topics(settings: Settings, timeout: float) -> set[str]:
    """Every topic the broker has, from one metadata request for all of them."""
    k = settings.kafka
    admin = AIOKafkaAdminClient(bootstrap_servers=k.bootstrap_servers,
                                request_timeout_ms=int(timeout * 1000),
                                **client_kwargs(k.security))
    try:
        await admin.start()
        return {t["topic"] for t in await admin.describe_topics() if t["error_code"] == 0}
    finally:
        await admin.close()
