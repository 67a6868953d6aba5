"""Messages between the actors: one poll's worth of records per message.

Fire-and-forget messages go by ``tell`` so that an exception in a handler
reaches the actor's ``on_failure`` (a proxy call would bury it in a future
nobody reads); request/response goes by ``ask``. Each actor takes one union
of them (``PipelineMessage``...), and its ``on_receive`` hands anything else
to ``unexpected``, which mypy checks is unreachable. Its senders hold its ref as a
``Mailbox`` of that union, so mypy refuses a message sent to the wrong actor too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Never, NoReturn, Protocol, TypeVar

from onceflow.checkpoint.ledger import Checkpoint
from onceflow.checkpoint.log_marks import LogMark
from onceflow.stages.outcome import Output
from onceflow.stages.state import TopicPartition


@dataclass(frozen=True)
class Batch:
    """Records from one getmany, in partition order."""

    records: Sequence[Any]  # aiokafka ConsumerRecords
    #: Called ON THE LOOP once processed (the consumer may fetch another); the pipeline
    #: hands it over with the batch's outputs (``coordinator.Checkpoints.hand_over``).
    done: Callable[[], None] | None = None
    #: Per partition, the batch's last record (``onceflow.checkpoint.log_marks``).
    marks: Mapping[TopicPartition, LogMark] = field(default_factory=dict)


@dataclass(frozen=True)
class PersistTick:
    """Time to snapshot dirty states (the throttle of the persistence interval)."""


@dataclass(frozen=True)
class LogStats:
    """Time to log the running counters."""


@dataclass(frozen=True)
class Flush:
    """(ask) Snapshot now and wait until it is durable; answers the durable offsets."""


@dataclass(frozen=True)
class Assigned:
    """(tell) The partitions this worker was just assigned: windowed stages read back their
    watermarks and open-window index before any record of them (``stages.window_clock``)."""

    partitions: frozenset[TopicPartition]
    positions: Mapping[TopicPartition, int] | None = None  # where each resumes (joins)
    #: Root logs forgotten at least once: their generation (``lineage.root_offset``).
    generations: Mapping[TopicPartition, int] | None = None


@dataclass(frozen=True)
class Forget:
    """(ask) Drop cached states and the progress of partitions this worker lost
    (revoked after their final commit, or found stale on a new assignment)."""

    partitions: frozenset[TopicPartition]


@dataclass(frozen=True)
class Send:
    """Records to produce, in order; ``number`` is the ledger's number of this send;
    ``depends``: the input partitions of the batch they come from (their epochs are
    checked before exclusive outputs are produced)."""

    outputs: Sequence[Output]
    number: int
    depends: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True)
class ResumeOutputs:
    """(ask) What an exclusive republish finds already in its output ``topic``: per input
    partition the highest position written, for the input partitions ``scanned``. For a
    side output (dead letters, late events), ``partitions``: the topic's partition count."""

    topic: str
    written: dict[TopicPartition, tuple[int, ...]]
    scanned: frozenset[TopicPartition]
    partitions: int | None = None
    #: A side output's late events past the committed offsets (``side_outputs.LateMarks``).
    late: dict[TopicPartition, dict[int, dict[tuple[str, tuple[int, ...]], int]]] | None = None


@dataclass(frozen=True)
class StageRows:
    """One aggregate's share of a snapshot; with ``expire_after`` (seconds), its states'
    rows expire that long after this write, but for ``lasting`` (open windows)."""

    stage_id: str
    store: str
    states: dict[str, bytes]
    closed_windows: dict[tuple[str, int], bytes]
    expire_after: float = 0.0
    lasting: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Snapshot:
    """Dirty states and closed windows (encoded, pipeline order), and the
    checkpoint they make durable."""

    rows: Sequence[StageRows]
    checkpoint: Checkpoint
    stats: dict[str, int] = field(default_factory=dict)


PipelineMessage = Batch | PersistTick | LogStats | Flush | Forget | Assigned | ResumeOutputs

_Accepted = TypeVar("_Accepted", contravariant=True)


class Mailbox(Protocol[_Accepted]):
    """An actor's ref as its senders see it, typed by the messages the actor takes.

    pykka's ``ActorRef`` takes any object (and is generic in the actor, not in its
    messages); a ``pykka.ActorRef`` is a ``Mailbox`` of any union, so the sender names the
    union its actor's ``on_receive`` takes (``Mailbox[PipelineMessage]``). An ask's answer
    stays ``Any``: pykka's ``ask`` is overloaded on ``block``, which no protocol can follow.
    """

    def tell(self, message: _Accepted) -> None: ...

    def ask(self, message: _Accepted, *, timeout: float | None = None) -> Any: ...


def unexpected(receiver: str, message: Never) -> NoReturn:
    """Reject a message outside the receiver's union.

    Typed like ``typing.assert_never``, so mypy reports a member of the union
    that ``on_receive`` forgot; at run time a stray message raises
    ``TypeError``, which fails the actor (and reaches the supervisor).
    """
    raise TypeError(f"{receiver}: unexpected message {message!r}")
