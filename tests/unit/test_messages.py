"""A message outside an actor's union: an error to who asked, a reported failure if told."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow.actors.messages import LogStats, Send
from onceflow.actors.pipeline_actor import PipelineActor
from onceflow.stages.pipeline import Pipeline


def test_a_message_outside_the_union_is_rejected() -> None:
    reported: list[tuple[str, BaseException]] = []
    unused: Any = None  # nothing is produced or persisted here
    ref = PipelineActor.start(pipeline=Pipeline("p", topics=("t",), format="json"), stores={},
                              dead_letter_topic="dlt", late_events_topic="late",
                              producer=unused, checkpoints=unused,
                              on_fatal=lambda who, error: reported.append((who, error)))
    try:
        assert ref.ask(LogStats(), timeout=5) is None  # its own message
        with pytest.raises(TypeError, match="PipelineActor: unexpected message Send"):
            ref.ask(Send([], 0), timeout=5)  # the asker gets the error
        ref.tell(Send([], 0))  # told: the actor fails and reports it
        assert ref.actor_stopped.wait(5)
    finally:
        ref.stop()
    assert [(who, type(error)) for who, error in reported] == [("PipelineActor", TypeError)]
