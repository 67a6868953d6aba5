"""The worker: one pipeline's actors under a supervisor, until told to stop.

``PipelineActors`` wires one incarnation of the actors; its start order
breaks the reference cycle (consumer -> stage -> persistence -> commit ->
consumer) at commit -> consumer, set before any tick can reach the commit
actor. The supervisor replaces a failed incarnation (which commits only what
is already durable) and escalates when its budget is spent: the worker then
exits 1. A graceful stop (SIGTERM) stops fetching, flushes what was
processed, commits it, leaves the group and exits 0.
"""

from __future__ import annotations

import gc
import importlib
import logging
import threading
import time
from typing import Any

import pykka

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler
from onceflow.actors.commit import CommitActor
from onceflow.actors.consumer import ConnectionCheck, ConsumerActor, GapCheck
from onceflow.actors.delivery import Adoption, DeliverySettings, OutboxTally
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import (
    CommitNow,
    CommitTick,
    Flush,
    LogStats,
    PersistTick,
    StopFetching,
)
from onceflow.actors.persistence import PersistenceActor
from onceflow.actors.producer import ProducerActor
from onceflow.actors.stage import StageActor
from onceflow.actors.supervisor import (
    ChildSpec,
    ChildState,
    Policy,
    RestartSettings,
    Supervisor,
)
from onceflow.actors.ticker import Ticker
from onceflow.runtime.config import ConfigError, Settings
from onceflow.runtime.health import HealthServer
from onceflow.runtime.topics import ensure_repartition_topics
from onceflow.stages.pipeline import Pipeline
from onceflow.stores.base import StateStore
from onceflow.stores.redis_store import RedisStore

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1


def load_pipeline(settings: Settings) -> Pipeline:
    """Import the ``module:attribute`` named by ``onceflow.pipeline``."""
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
            f"{settings.pipeline!r}: {type(error).__name__}: {error}",
        ) from None
    if not isinstance(target, Pipeline):
        raise ConfigError(
            settings.source,
            "onceflow.pipeline",
            f"expected a onceflow.stages.Pipeline, {settings.pipeline!r} is a "
            f"{type(target).__name__}",
        )
    return target


STORES = ("redis", "cassandra")


def check_stores(settings: Settings, pipeline: Pipeline) -> None:
    """Every aggregate names a store kind this build supports."""
    for spec in pipeline.aggregates:
        if spec.store not in STORES:
            raise ConfigError(
                settings.source,
                f"onceflow.stores.{spec.store}",
                f"aggregate {spec.id!r} uses store {spec.store!r}; supported: {', '.join(STORES)}",
            )


def open_stores(settings: Settings, pipeline: Pipeline) -> dict[str, StateStore]:
    """One client per store the pipeline's aggregates use, by store name.

    A store no aggregate names is never opened (a Redis-only pipeline does
    not even load the Cassandra driver). Clients connect lazily, at their
    first call. Names are in the order the aggregates first use them.
    """
    names = dict.fromkeys(spec.store for spec in pipeline.aggregates)
    return {name: open_store(settings, name, pipeline.id) for name in names}


def open_store(settings: Settings, name: str, pipeline_id: str) -> StateStore:
    if name == "redis":
        redis = settings.stores.redis
        return RedisStore(redis.url, redis.key_prefix, pipeline_id)
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
        )
    raise ConfigError(settings.source, f"onceflow.stores.{name}",
                      f"unknown store {name!r}; supported: {', '.join(STORES)}")


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
        "linger_ms": int(p.linger * 1000),
        "max_batch_size": p.batch_size,
        "max_request_size": max(p.batch_size, 1_048_576),
    }


def outbox_store(settings: Settings, pipeline: Pipeline) -> str | None:
    """The store kind that keeps the producer's outbox, None for no outbox."""
    kind = settings.kafka.producer.outbox_store
    if kind == "auto":
        return next((spec.store for spec in pipeline.aggregates), "redis")
    return None if kind == "none" else kind


def delivery_settings(settings: Settings) -> DeliverySettings:
    p = settings.kafka.producer
    return DeliverySettings(
        delivery_timeout=p.delivery_timeout, request_timeout=p.request_timeout,
        retries=p.retries, retry_backoff=p.retry_backoff,
        reconnect_backoff=p.reconnect_backoff, reconnect_backoff_max=p.reconnect_backoff_max)


def connection_check(settings: Settings) -> ConnectionCheck | None:
    c = settings.kafka.connection_checker
    return ConnectionCheck(c.max_retries, c.check_interval, c.backoff_factor) if c.enable else None


def tune_gc() -> None:
    """Fewer collections: a batch keeps thousands of small objects alive at once.

    With CPython's default threshold (700) the cyclic collector runs every
    few records and rescans the cached states; measured on the robot
    pipeline the runner goes from ~54k to ~87k records/s. Objects created
    before the worker starts are frozen out of collection altogether.
    """
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


class PipelineActors:
    """One incarnation of a pipeline's actors, wired and running.

    The supervisor starts one, and on a failure stops it and starts a new
    one (one_for_all): a fresh consumer resumes from the committed offsets
    and states reload from the store, so nothing processed but not durable
    survives into the new incarnation, and nothing is lost either.
    """

    def __init__(self, settings: Settings, pipeline: Pipeline, on_fatal: FatalHandler):
        s = self.settings = settings
        self.on_fatal = on_fatal
        self._io = EventLoopThread()
        start_timeout = s.kafka.request_timeout + 10
        try:
            self._io.run(ensure_repartition_topics(
                s.kafka.bootstrap_servers, pipeline, s.kafka.repartition_replication_factor),
                timeout=start_timeout)
        except BaseException:
            self._io.stop()
            raise
        self._stores = [open_stores(s, pipeline), open_stores(s, pipeline)]
        stage_stores, write_stores = self._stores
        # Stats go to the first store the pipeline uses; a stateless republisher has none.
        stats_store = next(iter(write_stores.values()), None)
        outbox_kind = outbox_store(s, pipeline)
        self._outbox = None if outbox_kind is None else open_store(s, outbox_kind, pipeline.id)
        tally, adoption = OutboxTally(), Adoption()
        self._producer = ProducerActor.start(
            options=producer_options(s), delivery=delivery_settings(s),
            max_block=s.kafka.producer.max_block, outbox=self._outbox, tally=tally,
            adoption=adoption,
            io=self._io, start_timeout=start_timeout,
            on_fatal=on_fatal,
        )
        self._commit = CommitActor.start(on_fatal=on_fatal, outboxed=lambda: tally.value)
        landing = None
        if s.landing.dir is not None and write_stores:  # Parquet handoff of closed windows
            from onceflow.analytics.landing import LandingZone

            landing = LandingZone(s.landing.dir, pipeline.id)
        self._persistence = PersistenceActor.start(
            stores=write_stores,
            producer=self._producer,
            commit=self._commit,
            stats_store=stats_store,
            on_fatal=on_fatal,
            landing=landing,
        )
        self._stage = StageActor.start(
            pipeline=pipeline,
            stores=stage_stores,
            dead_letter_topic=s.kafka.dead_letter_topic,
            late_events_topic=s.kafka.late_events_topic,
            producer=self._producer,
            persistence=self._persistence,
            on_fatal=on_fatal,
            single_worker=s.single_worker,
        )
        self._consumer = ConsumerActor.start(
            options=consumer_options(s),
            topics=pipeline.consumed_topics,
            max_in_flight=s.consumer.max_in_flight_batches,
            max_records=s.kafka.max_poll_records,
            poll_timeout=s.kafka.fetch_max_wait + 0.1,
            start_timeout=start_timeout,
            io=self._io,
            stage=self._stage,
            commit=self._commit,
            on_fatal=on_fatal,
            connection_check=connection_check(s),
            on_assigned=adoption,
            gap_check=GapCheck(s.consumer.gap_refetches, s.consumer.gap_refetch_backoff)
            if s.consumer.gap_refetches else None,
        )
        self._commit.proxy().use_consumer(self._consumer).get()
        # Stop order: consumer first (no new batches), producer last (flushes sends).
        self._actors: list[pykka.ActorRef[Any]] = [
            self._consumer, self._stage, self._persistence, self._commit, self._producer]
        self._tickers = [
            Ticker(self._stage, PersistTick(), s.persistence.interval).start(),
            Ticker(self._commit, CommitTick(), s.commit.interval).start(),
            Ticker(self._stage, LogStats(), s.metrics.stats_interval).start(),
        ]
        self._stopped = False

    def drain(self) -> dict[Any, int]:
        """Graceful: stop fetching, persist everything processed, commit it."""
        timeout = self.settings.shutdown.timeout
        self._consumer.ask(StopFetching(), timeout=timeout)
        self._stage.ask(Flush(), timeout=timeout)
        committed: dict[Any, int] = self._commit.ask(CommitNow(), timeout=timeout)  # type: ignore[assignment]
        return committed

    def stop(self) -> None:
        """Stop every actor; commit only what is already durable (never more)."""
        if self._stopped:
            return
        self._stopped = True
        for ticker in self._tickers:
            ticker.stop()
        timeout = self.settings.shutdown.timeout
        try:
            self._commit.ask(CommitNow(), timeout=timeout)
        except Exception as error:  # nothing more is committed then; a replay covers it
            log.warning("final commit of durable offsets failed: %r", error)
        for ref in self._actors:
            try:
                ref.stop(timeout=timeout)
            except Exception as error:  # a failed actor is already stopped
                log.debug("stopping %s: %r", ref, error)
        self._io.stop()
        for stores in self._stores:
            for store in stores.values():
                store.close()
        if self._outbox is not None:
            self._outbox.close()


class Worker:
    """One pipeline in one process, its actors under a supervisor."""

    def __init__(self, settings: Settings, pipeline: Pipeline):
        self.settings = settings
        self.pipeline = pipeline
        self._stop = threading.Event()
        self._failure: tuple[str, BaseException] | None = None
        self._current: PipelineActors | None = None
        self._supervisor: pykka.ActorRef[Any] | None = None
        self._http: HealthServer | None = None

    def _escalate(self, who: str, error: BaseException) -> None:
        if self._failure is None:
            self._failure = (who, error)
            log.error("supervisor escalated after %s failed: %r", who, error)
        self._stop.set()

    def request_stop(self) -> None:
        """Ask for a graceful stop (safe from a signal handler)."""
        self._stop.set()

    def _start_pipeline(self, report: FatalHandler) -> PipelineActors:
        self._current = PipelineActors(self.settings, self.pipeline, report)
        return self._current

    def start(self) -> None:
        tune_gc()
        sv = self.settings.supervision
        restart = RestartSettings(Policy(sv.policy), sv.max_restarts, sv.within,
                                  sv.backoff_initial, sv.backoff_max, sv.backoff_jitter)
        self._supervisor = Supervisor.start(
            [ChildSpec("pipeline", self._start_pipeline)], restart, self._escalate
        )
        m = self.settings.metrics
        if m.port:
            self._http = HealthServer(m.host, m.port, self.status).start()
            log.info("metrics and health on http://%s:%d/", m.host, self._http.port)
        log.info("worker started: pipeline %r on %s", self.pipeline.id, self.pipeline.topics)

    def status(self) -> dict[str, Any]:
        """What /health reports: per-child state, escalation, progress and lag."""
        states: dict[str, Any] = {}
        if self._supervisor is not None:
            try:
                states = {k: str(v) for k, v in
                          self._supervisor.proxy().states().get(timeout=2).items()}
            except Exception:  # the supervisor is gone: the worker is stopping
                states = {"pipeline": "stopped"}
        idle = metrics.seconds_since_progress()
        lag = metrics.total_lag()
        stalled = lag > 0 and idle > self.settings.metrics.stall_timeout
        return {
            "healthy": self._failure is None and states.get("pipeline") == "running"
            and not stalled,
            "pipeline": self.pipeline.id,
            "children": states,
            "escalated": None if self._failure is None else
            f"{self._failure[0]}: {self._failure[1]!r}",
            "seconds_since_progress": round(idle, 3),
            "lag": lag,
            "stalled": stalled,
        }

    def run(self) -> int:
        """Block until a stop is requested or the supervisor escalates; return the exit code."""
        self._stop.wait()
        return self.shutdown()

    def shutdown(self) -> int:
        assert self._supervisor is not None
        supervisor = self._supervisor.proxy()
        running = supervisor.states().get().get("pipeline") == ChildState.RUNNING
        if self._failure is None and running and self._current is not None:
            try:
                log.info("stopped: flushed and committed %s", self._current.drain())
            except Exception as error:
                self._escalate("shutdown", error)
        supervisor.stop_children().get()
        if self._failure is not None and self.settings.supervision.escalation_grace:
            time.sleep(self.settings.supervision.escalation_grace)  # /health says 503 meanwhile
        self._supervisor.stop()
        if self._http is not None:
            self._http.stop()
        return EXIT_OK if self._failure is None else EXIT_FAILED
