"""The worker's ``consumer`` child: one Kafka consumer stream feeding the current core.

It depends on the core (``pipeline_core``) and is the part a broker outage, a
silent connection or a stuck join fails: the supervisor re-creates it alone,
and the cached states stay (the ledger says which partitions, if any, came
back from elsewhere and must reload). Its assignment work, the tail reads of
exclusive outputs and the log check, is wired here too.
"""

from __future__ import annotations

import logging

from onceflow.actors.base import FatalHandler
from onceflow.checkpoint.log_marks import LogCheck, MarkRows
from onceflow.kafka.consumer import ConsumerActor
from onceflow.kafka.continuity import GapCheck
from onceflow.kafka.join_watch import JoinWatch
from onceflow.kafka.tail_reader import (
    ExclusiveResume,
    TailReader,
    resumed_outputs,
    tail_options,
)
from onceflow.runtime.join_setup import join_options
from onceflow.runtime.pipeline_core import PipelineCore
from onceflow.runtime.wiring import connection_check, consumer_options

log = logging.getLogger(__name__)


class ConsumerStream:
    """The ``consumer`` child: one Kafka consumer feeding the current core.

    Re-created alone after an outage (seed 004's stream shutdown -> re-create):
    it rejoins the group and, on its assignment, the ledger compares where the
    group resumes each partition with what this worker last committed.
    """

    def __init__(self, core: PipelineCore, on_fatal: FatalHandler):
        s = core.settings
        self.join = JoinWatch(s.kafka.join_timeout)
        self._core = core
        self._timeout = s.shutdown.timeout
        self.actor = ConsumerActor(
            options=join_options(consumer_options(s), core.pipeline),
            topics=core.pipeline.consumed_topics,
            max_in_flight=s.consumer.max_in_flight_batches,
            max_records=s.kafka.max_poll_records,
            poll_timeout=s.kafka.fetch_max_wait + 0.1,
            start_timeout=core.start_timeout,
            io=core.io,
            pipeline=core.pipeline_actor,
            checkpoints=core.checkpoints,
            producer=core.producer,
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
        self.actor.start()

    def stop_fetching(self) -> None:
        self.actor.stop_fetching(self._timeout)

    def stop(self) -> None:
        try:  # a failed stream never ran its own stop: nothing more commits through it
            self._core.io.call_soon(self._core.checkpoints.use_consumer, None)
        except RuntimeError as error:  # the core's loop is closed: the core is gone too
            log.debug("detaching the stream from the commits: %r", error)
        try:
            self.actor.stop()
        except Exception as error:  # a loop already gone, a close that failed
            log.warning("stopping the consumer: %r", error)


def exclusive_resume(core: PipelineCore, on_fatal: FatalHandler) -> ExclusiveResume:
    """The tail reads on assignment: exclusive republish steps, dead letters, late events."""
    kafka = core.settings.kafka
    outputs = resumed_outputs(core.pipeline, kafka.dead_letter_topic, kafka.late_events_topic)
    reader = TailReader(tail_options(consumer_options(core.settings)), core.start_timeout)
    return ExclusiveResume(outputs, reader, core.pipeline_actor, core.producer, on_fatal)


def log_check(core: PipelineCore) -> LogCheck | None:
    """The check on assignment that each input log is the one the states were folded
    from (``onceflow.checkpoint.log_marks``): its marks in the pipeline's first store, or
    without one in its marks topic (``kafka.log_marks_topic``)."""
    store: MarkRows | None = next(iter(core.stage_stores.values()), None)
    if store is None:
        store = core.log_marks
    if store is None:
        return None
    return LogCheck(store, tail_options(consumer_options(core.settings)), core.start_timeout,
                    core.pipeline.republished_to)
