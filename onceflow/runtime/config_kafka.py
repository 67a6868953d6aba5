"""Builds ``onceflow.kafka``: the client, its producer and its connection checker."""

from __future__ import annotations

from typing import cast

from onceflow.runtime.config_reader import KAFKA_TOPIC, KAFKA_TOPIC_HINT, Reader, fmt
from onceflow.runtime.config_security import kafka_security
from onceflow.runtime.settings import (
    ConnectionCheckerSettings,
    IsolationLevel,
    KafkaSettings,
    OffsetReset,
    ProducerSettings,
)

_SERVERS = r"[^,\s]+:\d+(,\s*[^,\s]+:\d+)*"


def kafka_settings(read: Reader) -> KafkaSettings:
    """``onceflow.kafka``, with its timeouts checked against each other."""
    k = "onceflow.kafka."
    kafka = KafkaSettings(
        bootstrap_servers=read.text(k + "bootstrap-servers", _SERVERS, "'host:port[,host:port]'"),
        group_id=_group_id(read, k + "group-id"),
        client_id=read.text(k + "client-id"),
        auto_offset_reset=cast(
            OffsetReset,
            read.text(k + "auto-offset-reset", "earliest|latest", "one of 'earliest', 'latest'"),
        ),
        session_timeout=read.duration(k + "session-timeout", 1, 300),
        heartbeat_interval=read.duration(k + "heartbeat-interval", 0.01, 300),
        request_timeout=read.duration(k + "request-timeout", 1, 600),
        max_poll_records=read.integer(k + "max-poll-records", 1, 100_000),
        fetch_max_wait=read.duration(k + "fetch-max-wait", 0, 60),
        dead_letter_topic=read.text(k + "dead-letter-topic", KAFKA_TOPIC, KAFKA_TOPIC_HINT),
        late_events_topic=read.text(k + "late-events-topic", KAFKA_TOPIC, KAFKA_TOPIC_HINT),
        repartition_replication_factor=read.integer(k + "repartition-replication-factor", 1,
                                                    32767),
        connection_checker=ConnectionCheckerSettings(
            enable=read.boolean(k + "connection-checker.enable"),
            max_retries=read.integer(k + "connection-checker.max-retries", 0, 1000),
            check_interval=read.duration(k + "connection-checker.check-interval", 0.1, 3600),
            backoff_factor=read.number(k + "connection-checker.backoff-factor", 1.0, 100.0),
        ),
        producer=_producer(read),
        join_timeout=read.duration(k + "join-timeout", 1, 3600),
        security=kafka_security(read),
        dead_letter_max_value=read.integer(k + "dead-letter-max-value", 0, 64 * 1_048_576),
        isolation_level=cast(IsolationLevel, read.text(
            k + "consumer.isolation-level", "read_committed|read_uncommitted",
            "one of 'read_committed', 'read_uncommitted'")),
    )
    if kafka.heartbeat_interval >= kafka.session_timeout:
        raise read.error(
            k + "heartbeat-interval",
            f"expected a duration below session-timeout ({fmt(kafka.session_timeout)}), "
            f"got {fmt(kafka.heartbeat_interval)}",
        )
    if kafka.join_timeout < kafka.session_timeout:
        raise read.error(
            k + "join-timeout",
            f"expected a duration at least session-timeout ({fmt(kafka.session_timeout)}), "
            f"got {fmt(kafka.join_timeout)}",
        )
    return kafka


def _group_id(read: Reader, key: str) -> str:
    """The consumer group; a warning if it holds whitespace.

    Kafka accepts any group id, so one with a space is not refused (a running
    deployment may have its offsets under it). But it is most likely an
    unquoted HOCON value (``group-id = payments agg`` reads as one string with
    a space), and a group other than the one meant is a new group over the
    same states: it starts from ``auto-offset-reset``, and beside workers of
    the old group both would own every partition.
    """
    group = read.text(key)
    if any(char.isspace() for char in group):
        read.warn(key, f"the group id {group!r} holds whitespace (an unquoted HOCON value "
                  "keeps the spaces between its words): Kafka accepts it, but if it is not "
                  "the group this pipeline ran under, it is a new group over the same states, "
                  "starting from auto-offset-reset, and beside workers of the old group both "
                  "would own every partition")
    return group


def _producer(read: Reader) -> ProducerSettings:
    p = "onceflow.kafka.producer."
    settings = ProducerSettings(
        max_block=read.duration(p + "max-block", 0.1, 3600),
        metadata_max_age=read.duration(p + "metadata-max-age", 0.1, 86400),
        delivery_timeout=read.duration(p + "delivery-timeout", 0.1, 7 * 86400),
        request_timeout=read.duration(p + "request-timeout", 0.1, 3600),
        retries=read.integer(p + "retries", 0, 2_147_483_647),
        retry_backoff=read.duration(p + "retry-backoff", 0.0, 3600),
        reconnect_backoff=read.duration(p + "reconnect-backoff", 0.001, 3600),
        reconnect_backoff_max=read.duration(p + "reconnect-backoff-max", 0.001, 3600),
        max_in_flight=read.integer(p + "max-in-flight", 1, 1_000_000),
        linger=read.duration(p + "linger", 0.0, 60),
        batch_size=read.integer(p + "batch-size", 1024, 64 * 1_048_576),
        outbox_store=read.text(p + "outbox-store", r"auto|redis|cassandra|none",
                               "one of auto, redis, cassandra, none"),
    )
    if settings.max_in_flight != 1:
        raise read.error(p + "max-in-flight", "expected 1 (without idempotent producers, "
                         "which Tansu lacks, a second batch in flight can overtake a failed "
                         f"one, and downstream dedup would drop the re-sent records), got "
                         f"{settings.max_in_flight}")
    if settings.reconnect_backoff_max < settings.reconnect_backoff:
        raise read.error(p + "reconnect-backoff-max", "expected a duration at least "
                         f"reconnect-backoff ({fmt(settings.reconnect_backoff)}), got "
                         f"{fmt(settings.reconnect_backoff_max)}")
    return settings
