"""The worker: one pipeline's actors under a supervisor, until told to stop.

Two children, in dependency order (docs/architecture.md, "Supervision"):

- ``core`` (``pipeline_core.PipelineCore``): producer, persistence and
  pipeline actors, the commits, the stores, the event loop and the checkpoint ledger:
  everything that holds in-memory states and what is durable of them;
- ``consumer`` (``consumer_stream.ConsumerStream``): the Kafka consumer,
  which depends on the core. A broker outage, a silent connection or a stuck join fails only
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

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler
from onceflow.actors.supervisor import (
    ChildSpec,
    ChildState,
    Policy,
    RestartSettings,
    Supervisor,
)
from onceflow.kafka import skipped_batches
from onceflow.kafka.continuity import PartitionRewound
from onceflow.runtime.config import ConfigError, Settings
from onceflow.runtime.consumer_stream import ConsumerStream
from onceflow.runtime.cpu_placement import CpuPlacement
from onceflow.runtime.health import HealthLog, HealthServer, health_report
from onceflow.runtime.lag import LagWatch
from onceflow.runtime.pipeline_core import PipelineCore
from onceflow.runtime.wiring import (
    access_error,
    consumer_options,
    describe_store_uses,
    unfenced_stores,
)
from onceflow.stages.pipeline import Pipeline
from onceflow.stores.access import access_denied
from onceflow.stores.base import UndecodableState

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2  # a store refused the worker's credentials: as cli.EXIT_CONFIG
SIGNAL_POLL = 0.2  # s; a signal handler must not set an Event (see stop.StopSignals)
HEALTH_LOG_EVERY = 5.0  # s; /health's verdict read for the log (``HealthLog``)
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
        self._placement = CpuPlacement(settings.cpu)

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
                self._http = HealthServer(m.host, m.port, self.status, self.pipeline.id)
            except OSError as error:
                raise ConfigError(self.settings.source, "onceflow.metrics.port",
                                  f"expected a port free to listen on at {m.host}, "
                                  f"{m.port} is not: {error.strerror or error}") from None
        tune_gc()
        self._placement.start()  # before any thread starts: each inherits its CPU
        # a header name that is not UTF-8 must not stop fetches (tolerant_records), and
        # a transaction's marker is no hole to re-fetch (skipped_batches)
        skipped_batches.install()
        sv = self.settings.supervision
        restart = RestartSettings(Policy(sv.policy), sv.max_restarts, sv.within,
                                  sv.backoff_initial, sv.backoff_max, sv.backoff_jitter,
                                  sv.max_repeats)
        unfenced = unfenced_stores(self.settings, self.pipeline)
        log.info("%s", describe_store_uses(self.settings, self.pipeline))
        children = [ChildSpec("core", self._start_core),
                    ChildSpec("consumer", self._start_stream, depends_on=("core",))]
        for child in children:  # exported at 0 from the start (for increase() and alerts)
            metrics.RESTARTS.labels(child.name)
        self._supervisor = Supervisor.start(
            children,
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

    def status(self, wait: float = 2.0) -> dict[str, Any]:
        """What /health reports: per-child state, escalation, restart loop, progress, lag
        (``wait``: for the supervisor's answer, else its children count as starting)."""
        states: dict[str, Any] = {}
        looping, last = None, None
        if self._supervisor is not None:
            try:
                supervised: dict[str, Any] = self._supervisor.proxy().health().get(timeout=wait)
                states, looping = supervised["states"], supervised["looping"]
                last = supervised["last_failure"]
            except pykka.Timeout:  # busy starting a child (e.g. waiting for the broker)
                states = {"core": "starting", "consumer": "starting"}
            except Exception:  # the supervisor is gone: the worker is stopping
                states = {"core": "stopped", "consumer": "stopped"}
        consumer = None if self._stream is None else \
            {**self._stream.join.report(), "fetch": self._stream.actor.fetch_state()}
        escalated = None if self._failure is None else \
            f"{self._failure[0]}: {type(self._failure[1]).__name__}: {self._failure[1]}"
        lag = None
        if self._lag is not None:
            core = self._core
            owned = None if core is None else core.checkpoints.owned
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
        health, due = HealthLog(), time.monotonic() + HEALTH_LOG_EVERY
        while not (self._stop.wait(SIGNAL_POLL) or signalled()):
            self._placement.tick()
            if self._http is not None and time.monotonic() >= due:  # a server: /health
                due = time.monotonic() + HEALTH_LOG_EVERY
                health.observe(self.status(SIGNAL_POLL), time.monotonic())  # signals first
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
        self._placement.release()
        if self._failure is None:
            return EXIT_OK
        log.error("stopped: %s failed: %s", self._failure[0], self._failure[1])
        denied = access_denied(self._failure[1])
        if denied is None:
            return EXIT_FAILED
        print(f"onceflow: config error: {access_error(self.settings, denied)}", file=sys.stderr)
        return EXIT_CONFIG
