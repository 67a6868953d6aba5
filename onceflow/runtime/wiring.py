"""From settings to clients: the pipeline, its stores, and the Kafka clients' options.

Everything here is read once per pipeline incarnation by
``onceflow.runtime.worker``; a problem the settings can be blamed for is a
``ConfigError`` naming the file and key.
"""

from __future__ import annotations

import importlib
import logging
import re
from typing import Any

from onceflow.kafka.connection_check import ConnectionCheck
from onceflow.kafka.delivery import DeliverySettings
from onceflow.kafka.log_marks_topic import log_marks_topic
from onceflow.runtime import extras
from onceflow.runtime.app_path import import_hint
from onceflow.runtime.config import ConfigError, Settings
from onceflow.runtime.config_reader import KAFKA_TOPIC, KAFKA_TOPIC_HINT
from onceflow.runtime.kafka_security import client_kwargs
from onceflow.stages.pipeline import Pipeline, Repartition, Republish
from onceflow.stages.producer_dedup import NO_STORE
from onceflow.stores.access import StoreAccessDenied
from onceflow.stores.base import StateStore
from onceflow.stores.redis_store import RedisStore

log = logging.getLogger(__name__)


def load_pipeline(settings: Settings) -> Pipeline:
    """Import the ``module:attribute`` named by ``onceflow.pipeline``: a Pipeline, or a
    factory called with ``onceflow.pipeline-settings`` as keyword arguments.

    A factory lets one pipeline module serve several deployments (topics,
    stores, sizes from the HOCON file); setting names have their dashes
    turned into underscores (``repartition-topic`` -> ``repartition_topic``).
    """
    module_name, _, attribute = settings.pipeline.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except Exception as error:
        raise ConfigError(
            settings.source,
            "onceflow.pipeline",
            f"expected 'module:attribute' naming a Pipeline; cannot load "
            f"{settings.pipeline!r}: {type(error).__name__}: {error}"
            f"{import_hint(module_name, error)}",
        ) from None
    if isinstance(target, Pipeline):
        if settings.pipeline_settings:
            raise ConfigError(settings.source, "onceflow.pipeline-settings",
                              f"expected none: {settings.pipeline!r} is a Pipeline, not a "
                              "factory that takes settings")
        return target
    if not callable(target):
        raise ConfigError(
            settings.source,
            "onceflow.pipeline",
            f"expected a onceflow.stages.Pipeline or a factory returning one, "
            f"{settings.pipeline!r} is a {type(target).__name__}",
        )
    kwargs = {name.replace("-", "_"): value for name, value in settings.pipeline_settings.items()}
    try:
        built = target(**kwargs)
    except Exception as error:
        raise ConfigError(settings.source, "onceflow.pipeline-settings",
                          f"{settings.pipeline} with {kwargs} failed: "
                          f"{type(error).__name__}: {error}") from None
    if not isinstance(built, Pipeline):
        raise ConfigError(settings.source, "onceflow.pipeline",
                          f"expected {settings.pipeline!r} to return a onceflow.stages.Pipeline, "
                          f"got a {type(built).__name__}")
    return built


STORES = ("redis", "cassandra")


def check_stores(settings: Settings, pipeline: Pipeline) -> None:
    """Every aggregate (and dedup=) names a store kind this build supports."""
    for spec in pipeline.aggregates:
        if spec.store not in STORES:
            raise ConfigError(
                settings.source,
                f"onceflow.stores.{spec.store}",
                f"aggregate {spec.id!r} uses store {spec.store!r}; supported: {', '.join(STORES)}",
            )
    store = pipeline.dedup_store
    if pipeline.dedup is not None and store is None:
        raise ConfigError(settings.source, "onceflow.pipeline", f"pipeline {pipeline.id!r}: "
                          + NO_STORE)
    if store is not None and store not in STORES:
        raise ConfigError(settings.source, f"onceflow.stores.{store}", f"dedup= names store "
                          f"{store!r} for the producer sequences; supported: {', '.join(STORES)}")


def check_topic_names(settings: Settings, pipeline: Pipeline) -> None:
    """Every topic the pipeline reads or writes has a name Kafka accepts.

    Otherwise the worker would start and fail on its first fetch or send; a
    name with a space is most likely an unquoted HOCON value
    (``topic = payments raw``). Blamed on the ``onceflow.pipeline-settings``
    entry that holds the name, else on ``onceflow.pipeline``.
    """
    named = [(topic, "source topic") for topic in pipeline.topics]
    named += [(step.topic, f"{type(step).__name__.lower()} {step.id!r} topic")
              for step in pipeline.steps if isinstance(step, Republish | Repartition)]
    for topic, role in named:
        if isinstance(topic, str) and re.fullmatch(KAFKA_TOPIC, topic):
            continue
        key = next((f"onceflow.pipeline-settings.{name}" for name, value
                    in settings.pipeline_settings.items()
                    if value == topic or (isinstance(value, list) and topic in value)),
                   "onceflow.pipeline")
        raise ConfigError(settings.source, key, f"expected {KAFKA_TOPIC_HINT}, got {topic!r} "
                          f"(pipeline {pipeline.id!r}: {role})")


MAP_SAMPLE = 64  # input partitions each exclusive partition map is tried on at start


def check_exclusive(settings: Settings, pipeline: Pipeline) -> None:
    """Each exclusive republish step's partition map is a function of the input partition:
    a non-negative int, the same on every call (its range is checked against the output
    topic on assignment, when the partition counts are known)."""
    for step, inputs in pipeline.exclusive_outputs:
        for topic in inputs:
            for partition in range(MAP_SAMPLE):
                try:
                    first, again = (step.partition_of(topic, partition) for _ in range(2))
                except Exception as error:
                    raise ConfigError(settings.source, "onceflow.pipeline",
                                      f"republish {step.id!r}: partition({topic!r}, {partition}) "
                                      f"raised {type(error).__name__}: {error}") from None
                if type(first) is not int or first < 0 or first != again:
                    raise ConfigError(
                        settings.source, "onceflow.pipeline",
                        f"republish {step.id!r}: partition({topic!r}, {partition}) answered "
                        f"{first!r}, then {again!r}: an exclusive step needs a non-negative int "
                        "that depends on the input topic and partition only")


def check_landing(settings: Settings, pipeline: Pipeline) -> None:
    """A landing zone needs pyarrow, which only the analytics extra installs.

    Checked at start so that a worker without it stops with one config line,
    not with an ImportError when it builds its persistence actor.
    """
    if settings.landing.dir is None or not pipeline.aggregates:
        return  # off, or a stateless republisher: nothing is ever landed
    absent = extras.missing(("pyarrow",))
    if absent:
        raise ConfigError(settings.source, "onceflow.landing.dir",
                          extras.install_hint("the Parquet landing zone", "analytics")
                          + f" (missing: {', '.join(absent)}), or leave the key unset")


def unfenced_stores(settings: Settings, pipeline: Pipeline) -> list[str]:
    """What of the pipeline's writes is not fenced: an outbox in a store other than the
    one keeping the epochs (Redis if the pipeline's stages use it, else Cassandra).

    Every state store is fenced; a stateless republisher takes no epochs.
    """
    source = epoch_store(pipeline)
    outbox = outbox_store(settings, pipeline)
    return [f"the {outbox} outbox"] if source and outbox and outbox != source else []


def epoch_store(pipeline: Pipeline) -> str | None:
    """The store kind that keeps the fencing epochs (``held_epochs.epoch_source``): Redis if
    the pipeline's stages use it, else their other store; None for a pipeline without one."""
    names = _store_names(pipeline)
    return "redis" if "redis" in names else next(iter(names), None)


def open_stores(settings: Settings, pipeline: Pipeline) -> dict[str, StateStore]:
    """One client per store the pipeline's aggregates use, by store name.

    A store no aggregate names is never opened (a Redis-only pipeline does
    not even load the Cassandra driver). Clients connect lazily, at their
    first call. Names are in the order the aggregates first use them.
    """
    return {name: open_store(settings, name, pipeline.id) for name in _store_names(pipeline)}


def _store_names(pipeline: Pipeline) -> dict[str, None]:
    names = dict.fromkeys(spec.store for spec in pipeline.aggregates)
    if pipeline.dedup_store is not None:  # the producer sequences' store
        names[pipeline.dedup_store] = None
    names.update(dict.fromkeys(join.table.store for join, _ in pipeline.joins))  # their tables
    return names


def open_store(settings: Settings, name: str, pipeline_id: str) -> StateStore:
    if name == "redis":
        redis = settings.stores.redis
        return RedisStore(redis.url, redis.key_prefix, pipeline_id,
                          history_retention=settings.state.history_retention,
                          access=redis.access, wait_replicas=redis.wait_replicas,
                          wait_timeout=redis.wait_timeout)
    if name == "cassandra":
        from onceflow.stores.cassandra_store import CassandraStore

        c = settings.stores.cassandra
        return CassandraStore(
            c.contact_points,
            pipeline_id,
            port=c.port,
            keyspace=c.keyspace,
            replication=c.replication.cql_options(),
            protocol_version=c.protocol_version,
            local_datacenter=c.local_datacenter,
            consistency=c.consistency,
            connect_timeout=c.connect_timeout,
            request_timeout=c.request_timeout,
            concurrency=c.concurrency,
            history_retention=settings.state.history_retention,
            access=c.access,
        )
    raise ConfigError(settings.source, f"onceflow.stores.{name}",
                      f"unknown store {name!r}; supported: {', '.join(STORES)}")


def check_store_access(settings: Settings, pipeline: Pipeline) -> None:
    """Log in to every store the worker will use, once, before any actor starts, and log
    what each keeps of an acknowledged write (a WARNING where it can be lost).

    A store that refuses the login, the certificate or a permission is a
    ConfigError (the worker exits 2 naming the setting). One that does not
    answer is only logged: the worker starts and retries it, as at any outage.
    """
    names = _store_names(pipeline)
    kind = outbox_store(settings, pipeline)
    if kind is not None:
        names[kind] = None
    for name in names:
        store = open_store(settings, name, pipeline.id)
        try:
            error = store.check_access()
            if error is not None:
                log.warning("store %s does not answer yet (%s): starting, its calls are "
                            "retried", name, error)
            elif (durability := store.durability()) is not None:
                log.log(*durability)
        except StoreAccessDenied as denied:
            raise access_error(settings, denied) from None
        finally:
            store.close()


def access_error(settings: Settings, denied: StoreAccessDenied) -> ConfigError:
    """The setting to blame for a store's refusal, as a ConfigError."""
    prefix = f"onceflow.stores.{denied.store}."
    if denied.refused == "tls":
        return ConfigError(settings.source, prefix + "tls.ca-file", "expected the CA that "
                           f"signed {denied.store}'s certificate: {denied.reason}")
    if denied.refused == "certificate":
        return ConfigError(settings.source, prefix + "tls.cert-file", "expected a client "
                           f"certificate {denied.store} trusts: {denied.reason}")
    access = getattr(settings.stores, denied.store).access
    user = "the default user" if access.username is None else f"user {access.username!r}"
    if denied.refused == "permission":
        return ConfigError(settings.source, prefix + "username", f"expected a user allowed "
                           f"onceflow's commands, {denied.store} denied {user}: {denied.reason}")
    given = "no password" if access.password is None else "a password"
    return ConfigError(settings.source, prefix + "password", f"expected a login "
                       f"{denied.store} accepts, it refused {user} with {given}: {denied.reason}")


def consumer_options(settings: Settings) -> dict[str, Any]:
    """aiokafka consumer settings: manual commits only, everything else from config."""
    k = settings.kafka
    return {
        "bootstrap_servers": k.bootstrap_servers,
        "group_id": k.group_id,
        "client_id": k.client_id,
        "enable_auto_commit": False,
        "auto_offset_reset": k.auto_offset_reset,
        "session_timeout_ms": int(k.session_timeout * 1000),
        "heartbeat_interval_ms": int(k.heartbeat_interval * 1000),
        "request_timeout_ms": int(k.request_timeout * 1000),
        "max_poll_records": k.max_poll_records,
        "fetch_max_wait_ms": int(k.fetch_max_wait * 1000),
        "isolation_level": k.isolation_level,
        **client_kwargs(k.security),
    }


def producer_options(settings: Settings) -> dict[str, Any]:
    """aiokafka producer settings: acks from all replicas; no idempotence (Tansu has none).

    Delivery bounds, retries and the outbox are onceflow's (``delivery_settings``):
    aiokafka has no delivery timeout and would let a batch that expired be
    overtaken by the next one of its partition.
    """
    k, p = settings.kafka, settings.kafka.producer
    return {
        "bootstrap_servers": k.bootstrap_servers,
        "client_id": k.client_id,
        "acks": "all",
        "enable_idempotence": False,
        "request_timeout_ms": int(p.request_timeout * 1000),
        "retry_backoff_ms": int(p.retry_backoff * 1000),
        "metadata_max_age_ms": int(p.metadata_max_age * 1000),
        "linger_ms": int(p.linger * 1000),
        "max_batch_size": p.batch_size,
        "max_request_size": max(p.batch_size, 1_048_576),
        **client_kwargs(k.security),
    }


def outbox_store(settings: Settings, pipeline: Pipeline) -> str | None:
    """The store kind that keeps the producer's outbox, None for no outbox.

    ``auto``: the pipeline's first store (its first aggregate's, else its producer
    dedup table's), and none for a pipeline that uses no store: a stateless
    republisher runs on Kafka alone. There a delivery that fails past its bounds
    fails the core, which replays from the last commit (downstream drops the
    copies by the source chain, as after a crash). An outbox stays a choice
    (``redis``, ``cassandra``) for outages absorbed without a replay.
    """
    kind = settings.kafka.producer.outbox_store
    if kind == "auto":
        return next(iter(_store_names(pipeline)), None)
    return None if kind == "none" else kind


def store_uses(settings: Settings, pipeline: Pipeline) -> dict[str, str | None]:
    """Which store each part of the worker uses, None for none (logged at start).

    States and history rows are the aggregates'; log marks and stats go to the
    pipeline's first store (``persistence.StoreWriter``), epochs to one store
    (``epoch_store``). A pipeline without a store has none of them: no epochs
    (its exclusive outputs are not fenced), and its log marks go to a topic of its
    own (``kafka.log_marks_topic``: not a store, so None here).
    """
    first = next(iter(_store_names(pipeline)), None)
    return {
        "states": ", ".join(dict.fromkeys(spec.store for spec in pipeline.aggregates)) or None,
        "producer dedup": pipeline.dedup_store,
        "fencing epochs": epoch_store(pipeline),
        "log marks": first,
        "stats": first,
        "outbox": outbox_store(settings, pipeline),
    }


def describe_store_uses(settings: Settings, pipeline: Pipeline) -> str:
    """The start-up line that says which store each part uses, or why none."""
    uses = store_uses(settings, pipeline)
    marks_topic = f"topic {log_marks_topic(pipeline.id)}"
    parts = "; ".join(f"{part} {store or (marks_topic if part == 'log marks' else 'none')}"
                      for part, store in uses.items())
    if any(uses.values()):
        return f"stores: {parts}"
    return (f"stores: none ({parts}): a pipeline without aggregates or producer dedup "
            "tables needs no store. A delivery that fails past its bounds restarts the "
            "pipeline, which replays from the last commit; its log marks go to a topic of "
            "its own, so a re-created input topic is refused as with a store; without "
            "epochs its dead letters and exclusive outputs are not fenced against a paused "
            "worker (docs/guide/republish-and-rekeying.md, \"Which steps need a store\")")


def delivery_settings(settings: Settings) -> DeliverySettings:
    p = settings.kafka.producer
    return DeliverySettings(
        delivery_timeout=p.delivery_timeout, request_timeout=p.request_timeout,
        retries=p.retries, retry_backoff=p.retry_backoff,
        reconnect_backoff=p.reconnect_backoff, reconnect_backoff_max=p.reconnect_backoff_max)


def connection_check(settings: Settings) -> ConnectionCheck | None:
    c = settings.kafka.connection_checker
    return ConnectionCheck(c.max_retries, c.check_interval, c.backoff_factor) if c.enable else None
