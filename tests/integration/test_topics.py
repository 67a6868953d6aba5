"""Repartition topics are created at start, on the real broker, once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from helpers import create_topic

from onceflow.devtools.services import ServiceInfo
from onceflow.runtime.topics import TopicSetupError, ensure_repartition_topics
from onceflow.stages import Pipeline


def test_repartition_topics_are_created_with_the_declared_or_the_source_partition_count(
    kafka_service: ServiceInfo, unique_name: Callable[..., str]
) -> None:
    source, small, wide = unique_name("src"), unique_name("other"), unique_name("wide")
    create_topic(kafka_service.address, source, 3)
    create_topic(kafka_service.address, small, 1)
    name = unique_name("p")
    pipeline = (Pipeline(name, topics=(source, small))
                .repartition("by_a", key=str)
                .repartition("by_b", key=str, partitions=2, topic=wide))
    created = asyncio.run(ensure_repartition_topics(kafka_service.address, pipeline, 1))
    assert created == {f"{name}-by_a-repartition": 3, wide: 2}
    again = asyncio.run(ensure_repartition_topics(kafka_service.address, pipeline, 1))
    assert again == created  # a second worker starting finds them and creates nothing


def test_without_a_source_topic_or_a_declared_count_the_start_fails_with_the_reason(
    kafka_service: ServiceInfo, unique_name: Callable[..., str]
) -> None:
    pipeline = Pipeline("p", topics=(unique_name("absent"),)).repartition(
        "by_a", key=str, topic=unique_name("hop"))
    with pytest.raises(TopicSetupError, match="declare partitions="):
        asyncio.run(ensure_repartition_topics(kafka_service.address, pipeline, 1))
