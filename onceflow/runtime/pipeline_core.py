"""The worker's ``core`` child: the actors that hold the states, and what they share.

One incarnation holds the producer and pipeline actors, the checkpoint
coordinator (which owns the ledger, on the loop, and persistence's thread),
the stores and the event loop: everything that holds
in-memory states and what is durable of them. The supervisor restarts it as
one (docs/architecture.md, "Supervision"); the consumer stream
(``consumer_stream``) is started on it and never outlives it.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial

import pykka

from onceflow.actors.base import FatalHandler
from onceflow.actors.loop import EventLoopThread
from onceflow.actors.messages import Flush, LogStats, Mailbox, PersistTick, PipelineMessage
from onceflow.actors.pipeline_actor import PipelineActor
from onceflow.checkpoint.coordinator import Checkpoints
from onceflow.checkpoint.persistence import StoreWriter
from onceflow.kafka.delivery import OutboxTally
from onceflow.kafka.producer import ProducerActor
from onceflow.kafka.tail_reader import resumed_outputs
from onceflow.runtime.config import Settings
from onceflow.runtime.join_setup import open_merge_log
from onceflow.runtime.log_marks_setup import open_log_marks
from onceflow.runtime.topics import ensure_repartition_topics
from onceflow.runtime.wiring import (
    delivery_settings,
    open_store,
    open_stores,
    outbox_store,
    producer_options,
)
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing.held_epochs import Fencing, OutputFence, epoch_source, share_epochs

log = logging.getLogger(__name__)


def _tell(actor: Mailbox[PipelineMessage], message: PipelineMessage) -> None:
    """A tick, from the loop; an actor already stopped (its failure is being handled)
    misses it."""
    with contextlib.suppress(pykka.ActorDeadError):
        actor.tell(message)


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
        self._stores = [open_stores(s, pipeline), open_stores(s, pipeline)]
        stage_stores, write_stores = self._stores
        self.stage_stores = stage_stores  # read on assignment too (log marks)
        try:  # without a store, the log marks live in a topic of the pipeline's own
            self.log_marks = None if stage_stores else open_log_marks(
                s, pipeline, self.io, self.start_timeout)
        except BaseException:
            self.io.stop()  # no store was opened
            raise
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
        landing = None
        if s.landing.dir is not None and write_stores:  # Parquet handoff of closed windows
            from onceflow.analytics.landing import LandingZone

            landing = LandingZone(s.landing.dir, pipeline.id,
                                  [a.id for a in pipeline.aggregates if a.window is None])
        # The one owner of the ledger (on the loop); persistence is its thread for writes.
        self.checkpoints = Checkpoints(self.io, on_fatal, StoreWriter(
            stores=write_stores, stats_store=stats_store, landing=landing, fence=fence,
            marks=self.log_marks))
        self.producer = ProducerActor(
            options=producer_options(s), delivery=delivery_settings(s),
            max_block=s.kafka.producer.max_block, outbox=self._outbox,
            tally=OutboxTally(self.checkpoints.outboxed),
            outbox_guard=fence.held if fence is not None and self._outbox is not None
            and type(self._outbox) is type(source) else None,
            output_fence=output_fence,
            io=self.io, start_timeout=self.start_timeout,
            on_fatal=on_fatal,
        )
        self.checkpoints.use_producer(self.producer.send)
        try:  # no thread of its own: opened here, on the loop
            self.producer.start()
            self._merge_log = open_merge_log(s, pipeline, self.io, output_fence,
                                             self.start_timeout)  # joins only
        except BaseException:
            if self.log_marks is not None:  # its producer, on the loop still running
                with contextlib.suppress(Exception):
                    self.log_marks.close()
            self._close_io()
            raise
        self.pipeline_actor = PipelineActor.start(
            pipeline=pipeline,
            stores=stage_stores,
            dead_letter_topic=s.kafka.dead_letter_topic,
            late_events_topic=s.kafka.late_events_topic,
            producer=self.producer,
            checkpoints=self.checkpoints,
            on_fatal=on_fatal,
            single_worker=s.single_worker,
            max_states=s.state.max_cached_states,
            idle_timeout=s.windows.idle_timeout,
            max_future=s.windows.max_future,
            dead_letter_max_value=s.kafka.dead_letter_max_value,
            max_state_bytes=s.state.max_state_bytes,
            persist_interval=s.persistence.interval,
            expire_after=s.state.expire_after,
            merge_log=self._merge_log,
        )
        # Stop order: pipeline actor first (no new snapshots), producer last (flushes sends).
        self._actors: list[pykka.ActorRef[PipelineActor]] = [self.pipeline_actor]
        # Tickers are loop timers (no thread each): they only hand a message on.
        self._tickers = [
            self.io.every(s.persistence.interval, partial(_tell, self.pipeline_actor,
                                                          PersistTick())),
            self.io.every(s.commit.interval, self.checkpoints.tick),
            self.io.every(s.metrics.stats_interval, partial(_tell, self.pipeline_actor,
                                                            LogStats())),
        ]
        self._stopped = False

    def drain(self) -> dict[TopicPartition, int]:
        """Graceful, once the stream stopped fetching: persist everything processed, commit it."""
        timeout = self.settings.shutdown.timeout
        self.pipeline_actor.ask(Flush(), timeout=timeout)
        return self.checkpoints.commit_now(timeout)

    def stop(self) -> None:
        """Stop every actor; commit only what is already durable (never more)."""
        if self._stopped:
            return
        self._stopped = True
        for ticker in self._tickers:
            ticker.cancel()
        timeout = self.settings.shutdown.timeout
        try:
            self.checkpoints.commit_now(timeout)
        except Exception as error:  # nothing more is committed then; a replay covers it
            log.warning("final commit of durable offsets failed: %r", error)
        for ref in self._actors:
            try:
                ref.stop(timeout=timeout)
            except Exception as error:  # a failed actor is already stopped
                log.debug("stopping %s: %r", ref, error)
        try:
            if self._merge_log is not None:
                self._merge_log.close()
            if self.log_marks is not None:
                self.log_marks.close()
            self.producer.stop()
        except Exception as error:  # a loop already gone, a close that failed
            log.warning("stopping the producer: %r", error)
        self._close_io()

    def _close_io(self) -> None:
        """The loop, persistence's thread, then every store client."""
        self.io.stop()
        self.checkpoints.stop()
        for stores in self._stores:
            for store in stores.values():
                store.close()
        if self._outbox is not None:
            self._outbox.close()
