"""The worker: one pipeline's actors under a supervisor, until told to stop.

Two children, in dependency order (docs/architecture.md, "Supervision"):

- ``core`` (``PipelineCore``): producer, persistence, commit and pipeline
  actors, the stores, the event loop and the checkpoint ledger: everything
  that holds in-memory states and what is durable of them;
- ``consumer`` (``ConsumerStream``): the Kafka consumer, which depends on
  the core. A broker outage, a silent connection or a stuck join fails only
  this child: it is re-created and the cached states stay (the ledger says
  which partitions, if any, came back from elsewhere and must reload).

A failure of the core restarts both (under every policy, a child never
outlives what it depends on). The supervisor escalates when its budget is
spent: the worker then exits 1, or 2 when a store refused its login,
certificate or a permission (escalated at once: a restart cannot fix it). The
same failure ``max-repeats`` times in a row with no commit in between
escalates too (a restart loop no backoff ends). A graceful stop (SIGTERM)
stops fetching, flushes what was processed, commits it, leaves the group
and exits 0; the metrics port is bound before anything starts (taken: a
ConfigError, exit 2), and a stop or escalation that cannot finish in time
is ended by the CLI's exit deadline (``runtime/stop.py``).
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from onceflow.actors import metrics, tolerant_records
from onceflow.actors.base import FatalHandler
from onceflow.actors.commit import CommitActor
from onceflow.actors.consumer import ConsumerActor
from onceflow.actors.continuity import GapCheck, PartitionRewound
from onceflow.actors.delivery import OutboxTally
from onceflow.actors.fence import Fencing, OutputFence, epoch_source, share_epochs
from onceflow.actors.join_watch import JoinWatch
from onceflow.actors.ledger import SharedLedger
from onceflow.actors.log_marks import LogCheck
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import (
    CommitNow,
    CommitTick,
    Flush,
    LogStats,
    PersistTick,
    StopFetching,
)
from onceflow.actors.output_tail import (
    ExclusiveResume,
    TailReader,
    resumed_outputs,
    tail_options,
)
from onceflow.actors.persistence import PersistenceActor
from onceflow.actors.pipeline_actor import PipelineActor
from onceflow.actors.producer import ProducerActor
from onceflow.actors.supervisor import (
    ChildSpec,
    ChildState,
    Policy,
    RestartSettings,
    Supervisor,
)
from onceflow.actors.ticker import Ticker
from onceflow.runtime.config import ConfigError, Settings
from onceflow.runtime.health import HealthServer, health_report
from onceflow.runtime.lag import LagWatch
from onceflow.runtime.topics import ensure_repartition_topics
from onceflow.runtime.wiring import (
    access_error,
    connection_check,
    consumer_options,
    delivery_settings,
    open_store,
    open_stores,
    outbox_store,
    producer_options,
    unfenced_stores,
)
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.state import TopicPartition
from onceflow.stores.access import access_denied
from onceflow.stores.base import UndecodableState

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2  # a store refused the worker's credentials: as cli.EXIT_CONFIG
SIGNAL_POLL = 0.2  # s; a signal handler must not set an Event (see stop.StopSignals)
GRACE = 3.0  # s past the shutdown timeout (and escalation grace) before the exit is forced


def _permanent(error: BaseException) -> bool:
    """Failures no restart can fix: a store refusing us, a partition whose log restarted,
    a stored state that is no state."""
    return access_denied(error) is not None or isinstance(error, (PartitionRewound,
                                                                  UndecodableState))


def tune_gc() -> None:
    """Fewer collections: a batch keeps thousands of small objects alive at once.

    With CPython's default threshold (700) the cyclic collector runs every
    few records and rescans the cached states; measured on the robot
    pipeline the runner goes from ~54k to ~87k records/s. Objects created
    before the worker starts are frozen out of collection altogether.
    """
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


class PipelineCore:
    """The ``core`` child: one incarnation of the actors that hold the states.

    A restart stops it (committing only what is already durable) and starts
    a new one: states reload from the store and a new consumer stream
    resumes from the committed offsets, so nothing processed but not
    durable survives into the new incarnation, and nothing is lost either.
    """

    def __init__(self, settings: Settings, pipeline: Pipeline, on_fatal: FatalHandler):
        s = self.settings = settings
        self.pipeline = pipeline
        self.io = EventLoopThread()
        self.start_timeout = s.kafka.request_timeout + 10
        try:
            self.io.run(ensure_repartition_topics(
                s.kafka.bootstrap_servers, pipeline, s.kafka.repartition_replication_factor,
                s.kafka.security),
                timeout=self.start_timeout)
        except BaseException:
            self.io.stop()
            raise
        self.ledger = SharedLedger()
        self._stores = [open_stores(s, pipeline), open_stores(s, pipeline)]
        stage_stores, write_stores = self._stores
        self.stage_stores = stage_stores  # read on assignment too (log marks)
        # Stats go to the first store the pipeline uses; a stateless republisher has none.
        stats_store = next(iter(write_stores.values()), None)
        # Fencing: ONE store keeps the epochs; guards carry them to every store.
        source = epoch_source(stage_stores.values())
        others = share_epochs(source, stage_stores.values())
        self.fencing = None if source is None else Fencing(source, others=others)
        fence = None if self.fencing is None else self.fencing.fence
        outbox_kind = outbox_store(s, pipeline)
        self._outbox = None if outbox_kind is None else open_store(s, outbox_kind, pipeline.id)
        share_epochs(source, (*write_stores.values(), self._outbox))
        exclusive = frozenset(out.topic for out in resumed_outputs(
            pipeline, s.kafka.dead_letter_topic, s.kafka.late_events_topic))
        # The check before exclusive outputs (one read per batch), with persistence's clients.
        checker = epoch_source(write_stores.values())
        output_fence = None if checker is None or fence is None else \
            OutputFence(checker, fence, exclusive)
        self.producer = ProducerActor.start(
            options=producer_options(s), delivery=delivery_settings(s),
            max_block=s.kafka.producer.max_block, outbox=self._outbox,
            tally=OutboxTally(self._count_outboxed),
            outbox_guard=fence.held if fence is not None and self._outbox is not None
            and type(self._outbox) is type(source) else None,
            output_fence=output_fence,
            io=self.io, start_timeout=self.start_timeout,
            on_fatal=on_fatal,
        )
        self.commit = CommitActor.start(ledger=self.ledger, on_fatal=on_fatal)
        landing = None
        if s.landing.dir is not None and write_stores:  # Parquet handoff of closed windows
            from onceflow.analytics.landing import LandingZone

            landing = LandingZone(s.landing.dir, pipeline.id,
                                  [a.id for a in pipeline.aggregates if a.window is None])
        self._persistence = PersistenceActor.start(
            stores=write_stores,
            producer=self.producer,
            ledger=self.ledger,
            stats_store=stats_store,
            on_fatal=on_fatal,
            landing=landing,
            fence=fence,
        )
        self.pipeline_actor = PipelineActor.start(
            pipeline=pipeline,
            stores=stage_stores,
            dead_letter_topic=s.kafka.dead_letter_topic,
            late_events_topic=s.kafka.late_events_topic,
            producer=self.producer,
            persistence=self._persistence,
            ledger=self.ledger,
            on_fatal=on_fatal,
            single_worker=s.single_worker,
            max_states=s.state.max_cached_states,
            idle_timeout=s.windows.idle_timeout,
            max_future=s.windows.max_future,
            dead_letter_max_value=s.kafka.dead_letter_max_value,
            max_state_bytes=s.state.max_state_bytes,
        )
        # Stop order: pipeline actor first (no new snapshots), producer last (flushes sends).
        self._actors: list[pykka.ActorRef[Any]] = [  # several kinds of actor
            self.pipeline_actor, self._persistence, self.commit, self.producer]
        self._tickers = [
            Ticker(self.pipeline_actor, PersistTick(), s.persistence.interval).start(),
            Ticker(self.commit, CommitTick(), s.commit.interval).start(),
            Ticker(self.pipeline_actor, LogStats(), s.metrics.stats_interval).start(),
        ]
        self._stopped = False

    def _count_outboxed(self, delta: int) -> None:
        with self.ledger() as ledger:
            ledger.outboxed(delta)

    def drain(self) -> dict[TopicPartition, int]:
        """Graceful, once the stream stopped fetching: persist everything processed, commit it."""
        timeout = self.settings.shutdown.timeout
        self.pipeline_actor.ask(Flush(), timeout=timeout)
        committed: dict[TopicPartition, int] = self.commit.ask(CommitNow(), timeout=timeout)  # type: ignore[assignment]
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
            self.commit.ask(CommitNow(), timeout=timeout)
        except Exception as error:  # nothing more is committed then; a replay covers it
            log.warning("final commit of durable offsets failed: %r", error)
        for ref in self._actors:
            try:
                ref.stop(timeout=timeout)
            except Exception as error:  # a failed actor is already stopped
                log.debug("stopping %s: %r", ref, error)
        self.io.stop()
        for stores in self._stores:
            for store in stores.values():
                store.close()
        if self._outbox is not None:
            self._outbox.close()


class ConsumerStream:
    """The ``consumer`` child: one Kafka consumer feeding the current core.

    Re-created alone after an outage (seed 004's stream shutdown -> re-create):
    it rejoins the group and, on its assignment, the ledger compares where the
    group resumes each partition with what this worker last committed.
    """

    def __init__(self, core: PipelineCore, on_fatal: FatalHandler):
        s = core.settings
        self.join = JoinWatch(s.kafka.join_timeout)
        self._commit = core.commit
        self._timeout = s.shutdown.timeout
        self.actor = ConsumerActor.start(
            options=consumer_options(s),
            topics=core.pipeline.consumed_topics,
            max_in_flight=s.consumer.max_in_flight_batches,
            max_records=s.kafka.max_poll_records,
            poll_timeout=s.kafka.fetch_max_wait + 0.1,
            start_timeout=core.start_timeout,
            io=core.io,
            pipeline=core.pipeline_actor,
            commit=core.commit,
            producer=core.producer,
            ledger=core.ledger,
            on_fatal=on_fatal,
            connection_check=connection_check(s),
            gap_check=GapCheck(s.consumer.gap_refetches, s.consumer.gap_refetch_backoff,
                               s.consumer.rewind_grace),
            join_watch=self.join,
            single_worker=s.single_worker,
            stop_timeout=s.shutdown.timeout / 2,  # leaving the group: half the budget
            exclusive=exclusive_resume(core, on_fatal),
            fencing=core.fencing,
            log_check=log_check(core),
        )
        core.commit.proxy().use_consumer(self.actor).get()

    def stop_fetching(self) -> None:
        self.actor.ask(StopFetching(), timeout=self._timeout)

    def stop(self) -> None:
        try:
            self._commit.proxy().use_consumer(None).get(timeout=self._timeout)
        except Exception as error:  # the core is gone too
            log.debug("detaching the commit actor: %r", error)
        try:
            self.actor.stop(timeout=self._timeout)
        except Exception as error:  # a failed actor is already stopped
            log.debug("stopping the consumer: %r", error)


def exclusive_resume(core: PipelineCore, on_fatal: FatalHandler) -> ExclusiveResume:
    """The tail reads on assignment: exclusive republish steps, dead letters, late events."""
    kafka = core.settings.kafka
    outputs = resumed_outputs(core.pipeline, kafka.dead_letter_topic, kafka.late_events_topic)
    reader = TailReader(tail_options(consumer_options(core.settings)), core.start_timeout)
    return ExclusiveResume(outputs, reader, core.pipeline_actor, core.producer, on_fatal)


def log_check(core: PipelineCore) -> LogCheck | None:
    """The check on assignment that each input log is the one the states were folded
    from (``onceflow.actors.log_marks``); None for a pipeline without a store."""
    store = next(iter(core.stage_stores.values()), None)
    if store is None:
        return None
    return LogCheck(store, tail_options(consumer_options(core.settings)), core.start_timeout)


class Worker:
    """One pipeline in one process, its actors under a supervisor."""

    def __init__(self, settings: Settings, pipeline: Pipeline):
        self.settings = settings
        self.pipeline = pipeline
        self._stop = threading.Event()
        self._failure: tuple[str, BaseException] | None = None
        self._core: PipelineCore | None = None
        self._stream: ConsumerStream | None = None
        self._supervisor: pykka.ActorRef[Supervisor] | None = None
        self._http: HealthServer | None = None
        self._lag: LagWatch | None = None

    def _escalate(self, who: str, error: BaseException) -> None:
        if self._failure is None:
            self._failure = (who, error)
            log.error("supervisor escalated after %s failed: %r", who, error)
        self._stop.set()

    def request_stop(self) -> None:
        """Ask for a graceful stop, from any thread (not from a signal handler)."""
        self._stop.set()

    def _start_core(self, report: FatalHandler) -> PipelineCore:
        self._core = PipelineCore(self.settings, self.pipeline, report)
        return self._core

    def _start_stream(self, report: FatalHandler) -> ConsumerStream:
        assert self._core is not None  # started first, and restarted with it
        self._stream = ConsumerStream(self._core, report)
        return self._stream

    def start(self) -> None:
        """Bind the metrics port, then start the supervisor (which starts the children).

        The port is bound before anything starts: taken, it is a ConfigError
        naming the key, and no actor, thread or group join happened.
        """
        m = self.settings.metrics
        if m.port:
            try:
                self._http = HealthServer(m.host, m.port, self.status)
            except OSError as error:
                raise ConfigError(self.settings.source, "onceflow.metrics.port",
                                  f"expected a port free to listen on at {m.host}, "
                                  f"{m.port} is not: {error.strerror or error}") from None
        tune_gc()
        tolerant_records.install()  # a header name that is not UTF-8 must not stop fetches
        sv = self.settings.supervision
        restart = RestartSettings(Policy(sv.policy), sv.max_restarts, sv.within,
                                  sv.backoff_initial, sv.backoff_max, sv.backoff_jitter,
                                  sv.max_repeats)
        unfenced = unfenced_stores(self.settings, self.pipeline)
        self._supervisor = Supervisor.start(
            [ChildSpec("core", self._start_core),
             ChildSpec("consumer", self._start_stream, depends_on=("core",))],
            restart, self._escalate, permanent=_permanent, progress=metrics.commits,
        )
        try:
            if self._http is not None:
                k = self.settings.kafka
                self._lag = LagWatch(consumer_options(self.settings), k.group_id,
                                     self.pipeline.consumed_topics, m.lag_interval,
                                     timeout=max(10.0, k.request_timeout)).start()
                self._http.start(self._escalate)  # a server that dies stops the worker
                log.info("metrics and health on http://%s:%d/", m.host, self._http.port)
        except BaseException:  # no actor may outlive a failed start
            self._supervisor.proxy().stop_children().get(timeout=self.settings.shutdown.timeout)
            self._supervisor.stop()
            raise
        log.info("worker started: pipeline %r on %s", self.pipeline.id, self.pipeline.topics)
        if unfenced:
            log.warning("writes to %s are not fenced: a worker paused past its session "
                        "timeout could still add rows there, sent again later as duplicates "
                        "(docs/guide/security.md, Fencing)", ", ".join(unfenced))

    def status(self) -> dict[str, Any]:
        """What /health reports: per-child state, escalation, restart loop, progress, lag."""
        states: dict[str, Any] = {}
        looping, last = None, None
        if self._supervisor is not None:
            try:
                supervised: dict[str, Any] = self._supervisor.proxy().health().get(timeout=2)
                states, looping = supervised["states"], supervised["looping"]
                last = supervised["last_failure"]
            except pykka.Timeout:  # busy starting a child (e.g. waiting for the broker)
                states = {"core": "starting", "consumer": "starting"}
            except Exception:  # the supervisor is gone: the worker is stopping
                states = {"core": "stopped", "consumer": "stopped"}
        consumer = None if self._stream is None else self._stream.join.report()
        escalated = None if self._failure is None else \
            f"{self._failure[0]}: {type(self._failure[1]).__name__}: {self._failure[1]}"
        lag = None
        if self._lag is not None:
            core = self._core
            owned = None
            if core is not None:
                with core.ledger() as ledger:
                    owned = ledger.owned()
            lag = self._lag.report(owned)
        return health_report(self.pipeline.id, states, consumer, escalated,
                             self.settings.metrics.stall_timeout, lag, looping, last)

    def run(self, signalled: Callable[[], bool] = lambda: False,
            exit_within: Callable[[float, str], None] | None = None) -> int:
        """Wait for a stop (``request_stop``, ``signalled()``) or an escalation; the exit code.

        ``exit_within(seconds, why)`` (the CLI's ``StopSignals``) arms a hard deadline
        on the process once an escalation stops the worker: a shutdown blocked
        where no timeout reaches must not keep it alive (a stop signal arms its own).
        """
        while not (self._stop.wait(SIGNAL_POLL) or signalled()):
            pass
        if exit_within is not None and self._failure is not None:
            exit_within(self.settings.shutdown.timeout + self.settings.supervision.escalation_grace
                        + GRACE, f"escalation after {self._failure[0]} failed")
        return self.shutdown(signalled)

    def shutdown(self, signalled: Callable[[], bool] = lambda: False) -> int:
        assert self._supervisor is not None
        supervisor = self._supervisor.proxy()
        timeout = self.settings.shutdown.timeout
        try:
            states = supervisor.states().get(timeout=timeout)
        except pykka.Timeout:  # inside a child's start (a broker or store not answering)
            log.warning("the supervisor is busy starting a child: stopping without a drain")
            states = {}
        running = bool(states) and all(state == ChildState.RUNNING for state in states.values())
        core, stream = self._core, self._stream
        if self._failure is None and running and core is not None and stream is not None:
            try:
                stream.stop_fetching()
                log.info("stopped: flushed and committed %s (only offsets not committed before)",
                         core.drain())
            except Exception as error:
                self._escalate("shutdown", error)
        supervisor.stop_children().get()
        if self._failure is not None and self.settings.supervision.escalation_grace:
            # /health says 503 meanwhile; a stop signal cuts it short
            until = time.monotonic() + self.settings.supervision.escalation_grace
            while time.monotonic() < until and not signalled():
                time.sleep(min(SIGNAL_POLL, max(0.0, until - time.monotonic())))
        self._supervisor.stop()
        if self._lag is not None:
            self._lag.stop()
        if self._http is not None:
            self._http.stop()
        if self._failure is None:
            return EXIT_OK
        log.error("stopped: %s failed: %s", self._failure[0], self._failure[1])
        denied = access_denied(self._failure[1])
        if denied is None:
            return EXIT_FAILED
        print(f"onceflow: config error: {access_error(self.settings, denied)}", file=sys.stderr)
        return EXIT_CONFIG
