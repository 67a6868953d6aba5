"""A message outside an actor's union: an error to who asked, a reported failure if told."""

from __future__ import annotations

import pytest

from onceflow.actors.commit import CommitActor
from onceflow.actors.ledger import SharedLedger
from onceflow.actors.messages import CommitNow, Flush


def test_a_message_outside_the_union_is_rejected() -> None:
    reported: list[tuple[str, BaseException]] = []
    ref = CommitActor.start(ledger=SharedLedger(),
                            on_fatal=lambda who, error: reported.append((who, error)))
    try:
        assert ref.ask(CommitNow(), timeout=5) == {}  # its own message: nothing committable
        with pytest.raises(TypeError, match="CommitActor: unexpected message Flush"):
            ref.ask(Flush(), timeout=5)  # the asker gets the error
        ref.tell(Flush())  # told: the actor fails and reports it
        assert ref.actor_stopped.wait(5)
    finally:
        ref.stop()
    assert [(who, type(error)) for who, error in reported] == [("CommitActor", TypeError)]
