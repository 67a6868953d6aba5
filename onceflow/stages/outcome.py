"""What the runner hands back for a batch: records to produce, counters, failures.

``Output`` is a record to produce (republished values, dead letters, late
events); ``BatchOutcome`` gathers a batch's outputs, its counters and the
next offset of each partition it covered. ``StageFailure`` wraps what a user
function raised (the record goes to the dead-letter topic with it as the
reason), ``KeyHomedElsewhere`` a value for a key whose state another input
partition feeds (see ``onceflow.stages.runner``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from onceflow.shared_types import ConsumedHeader as ConsumedHeader  # defined there, once
from onceflow.shared_types import ConsumedRecord as ConsumedRecord  # defined there, once
from onceflow.stages.state import TopicPartition


class Output(NamedTuple):
    """A record to produce; ``headers`` as Kafka wants them; ``partition`` None: by key.

    A NamedTuple (immutable, and several times cheaper to build than a frozen
    dataclass): a republisher makes one per output record.
    """

    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None


@dataclass
class BatchOutcome:
    outputs: list[Output] = field(default_factory=list)
    dead_letters: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)
    folded: Counter[str] = field(default_factory=Counter)
    late: Counter[str] = field(default_factory=Counter)
    producer_duplicates: Counter[str] = field(default_factory=Counter)  # re-sent, dropped
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    misaligned: Counter[str] = field(default_factory=Counter)  # records of keys homed elsewhere
    misaligned_reason: dict[str, str] = field(default_factory=dict)  # the first one per stage
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)  # (stage, kind) -> n
    first_rejection: dict[tuple[str, str], str] = field(default_factory=dict)  # its reason
    side_skipped: int = 0  # dead letters and late events a replay found already written
    exclusive_skipped: dict[str, int] = field(default_factory=dict)  # topic -> outputs, likewise

    def dead_letter(self, output: Output, reason: Exception) -> None:
        """Count a dead letter by stage and kind of reason (``source`` for format errors)."""
        self.dead_letters += 1
        self.outputs.append(output)
        if isinstance(reason, StageFailure):
            slot = (reason.stage_id, type(reason.error).__name__)
        else:
            slot = ("source", getattr(reason, "kind", type(reason).__name__))
        self.rejected[slot] += 1
        self.first_rejection.setdefault(slot, str(reason))

    def stats(self, records: int) -> Counter[str]:
        """The batch's counters under the worker's stat names (``<stage>.folded`` ...)."""
        batch = Counter({"records": records, "dead_letters": self.dead_letters})
        if self.side_skipped:
            batch["side_outputs_skipped"] = self.side_skipped
        for name, counts in (("folded", self.folded), ("duplicates", self.duplicates),
                             ("late", self.late), ("misaligned", self.misaligned),
                             ("producer_duplicates", self.producer_duplicates)):
            batch.update({f"{stage}.{name}": n for stage, n in counts.items()})
        return batch


class StageFailure(Exception):
    """A user function raised, or made a state no store can hold (``guards.check_state``);
    the record goes to the dead-letter topic. ``key``: the aggregate key, when known."""

    def __init__(self, stage_id: str, error: BaseException, key: str | None = None):
        where = f"stage {stage_id!r}" if key is None else f"stage {stage_id!r}, key {_brief(key)}"
        super().__init__(f"{where}: {type(error).__name__}: {error}")
        self.stage_id = stage_id
        self.error = error
        self.key = key


def _brief(key: str) -> str:
    """A key as the reason quotes it: a huge key would crowd the error out of ``MAX_REASON``."""
    text = repr(key)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(key)} characters)"


class KeyHomedElsewhere(Exception):
    """A value for a key whose state is fed from another input partition."""

    def __init__(self, key: str, fed_from: TopicPartition, home: TopicPartition):
        super().__init__(
            f"key {key!r} is fed from {fed_from[0]}/{fed_from[1]} but its state is fed from "
            f"{home[0]}/{home[1]}; with more than one worker both would write the state and "
            "lose each other's folds: add .repartition(...) with this key before the aggregate "
            "(or set onceflow.single-worker = true if one worker runs this pipeline)")


#: Longest ``onceflow.reason`` kept, in characters (a user exception's message can be huge).
MAX_REASON = 2000
#: Default of ``onceflow.kafka.dead-letter-max-value``: value bytes a dead letter keeps.
DEAD_LETTER_MAX_VALUE = 524_288


def late_event(topic: str, record: ConsumedRecord, stage_id: str, key: str,
               position: tuple[int, ...], late_by_ms: int, root: tuple[str, int],
               max_value: int = DEAD_LETTER_MAX_VALUE, pipeline_id: str = "",
               index: int = 0) -> Output:
    """The record a late value came from, with which value it was and why it is late.

    ``onceflow.root`` (``topic/partition``) and ``onceflow.position`` name the
    value in its root partition's order (``stages.lineage``); ``onceflow.index``
    is its order among the record's late events (``side_outputs``: a replay
    skips those already written).
    """
    value, cut = _bounded(record.value, max_value)
    return Output(topic, _text(key), value, (
        ("onceflow.reason", f"late for stage {stage_id!r} by {late_by_ms} ms".encode()),
        ("onceflow.stage", _text(stage_id)),
        ("onceflow.pipeline", _text(pipeline_id)),
        ("onceflow.source", _source(record)),
        ("onceflow.index", str(index).encode()),
        ("onceflow.root", f"{root[0]}/{root[1]}".encode()),
        ("onceflow.position", ".".join(map(str, position)).encode()),
        *cut,
    ))


def dead_letter(topic: str, record: ConsumedRecord, pipeline_id: str, reason: Exception,
                max_value: int = DEAD_LETTER_MAX_VALUE) -> Output:
    """The record as it was consumed, with the reason and its origin in headers.

    Producible whatever the record holds: the key and the record's headers are
    left out, the reason is cut to ``MAX_REASON`` characters and any text that
    is not UTF-8 escaped, and a value longer than ``max_value`` is cut there
    (header ``onceflow.truncated``: its full length; the source header says
    where the whole record is). A dead letter the broker refused would hold
    its partition's commits back forever.
    """
    value, cut = _bounded(record.value, max_value)
    return Output(topic, None, value, (
        ("onceflow.reason", _text(_reason(reason))),
        ("onceflow.pipeline", _text(pipeline_id)),
        ("onceflow.source", _source(record)),
        *cut,
    ))


def _reason(reason: Exception) -> str:
    try:
        text = str(reason)
    except Exception as error:  # an exception whose __str__ fails
        text = f"{type(reason).__name__} (its message failed: {type(error).__name__})"
    if len(text) > MAX_REASON:
        text = f"{text[:MAX_REASON]}... ({len(text)} characters)"
    return text


def _text(text: str) -> bytes:
    """UTF-8, with what cannot be encoded (lone surrogates) escaped."""
    return text.encode(errors="backslashreplace")


def _bounded(value: bytes | None, limit: int) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    value = value or b""
    if len(value) <= limit:
        return value, ()
    return value[:limit], (("onceflow.truncated", str(len(value)).encode()),)


def _source(record: ConsumedRecord) -> bytes:
    return _text(f"{record.topic}/{record.partition}/{record.offset}")
