"""Applies batches of consumed records to a pipeline's in-memory states.

Pure logic, no I/O: the runtime hands in records, a loader for states not
yet in memory, and gets back what to produce, what to dead-letter and which
offsets the batch covered. Each record is one unit: every value it fans out
to is folded into every aggregate, or none is (its new states are staged
and only then installed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.lineage import Position, RootPartition, event_id, extended_chain, root_of
from onceflow.stages.pipeline import Aggregate, FlatMap, Map, Pipeline, Republish
from onceflow.stages.state import AggregateState

TopicPartition = tuple[str, int]
StateLoader = Callable[[Aggregate, Sequence[str]], Mapping[str, AggregateState]]


class ConsumedRecord(Protocol):
    """What the runner needs of a Kafka record (aiokafka's ConsumerRecord fits)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True)
class Output:
    """A record to produce; ``headers`` as Kafka wants them."""

    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class BatchOutcome:
    outputs: list[Output] = field(default_factory=list)
    dead_letters: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)
    folded: Counter[str] = field(default_factory=Counter)
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)


class StageFailure(Exception):
    """A user function raised; the record goes to the dead-letter topic."""

    def __init__(self, stage_id: str, error: BaseException):
        super().__init__(f"stage {stage_id!r}: {type(error).__name__}: {error}")
        self.stage_id = stage_id


@dataclass
class _Plan:
    """One record after the stateless steps: what it folds and what it emits."""

    record: ConsumedRecord
    root: RootPartition
    folds: list[tuple[int, list[tuple[str, Position, Any]]]]
    outputs: list[Output]


class StateTable:
    """The in-memory states of one aggregate and which of them changed."""

    def __init__(self, spec: Aggregate):
        self.spec = spec
        self.states: dict[str, AggregateState] = {}
        self.dirty: set[str] = set()

    def take_dirty(self) -> dict[str, AggregateState]:
        taken = {key: self.states[key] for key in self.dirty}
        self.dirty = set()
        return taken


class PipelineRunner:
    """Runs a pipeline's steps over batches; owns the in-memory state tables."""

    def __init__(self, pipeline: Pipeline, load: StateLoader, dead_letter_topic: str):
        self.pipeline = pipeline
        self.tables = [StateTable(spec) for spec in pipeline.aggregates]
        self._table_of_step = {
            i: self.tables[n]
            for n, i in enumerate(
                i for i, s in enumerate(pipeline.steps) if isinstance(s, Aggregate)
            )
        }
        self._load = load
        self._dead_letter_topic = dead_letter_topic

    def process(self, records: Iterable[ConsumedRecord]) -> BatchOutcome:
        outcome = BatchOutcome()
        plans: list[_Plan] = []
        for record in records:
            outcome.next_offsets[(record.topic, record.partition)] = record.offset + 1
            try:
                plans.append(self._plan(record))
            except (StageFailure, _Undecodable) as failure:
                self._dead_letter(outcome, record, failure)
        self._load_missing(plans)
        for plan in plans:
            try:
                self._apply(plan, outcome)
            except StageFailure as failure:
                self._dead_letter(outcome, plan.record, failure)
        return outcome

    def forget(self) -> None:
        """Drop every cached state (after a rebalance another worker may own them)."""
        for table in self.tables:
            if table.dirty:
                raise RuntimeError(f"forget() with unpersisted states in {table.spec.id!r}")
            table.states.clear()

    def _plan(self, record: ConsumedRecord) -> _Plan:
        try:
            envelope = Envelope.FromString(record.value or b"")
        except DecodeError as error:
            raise _Undecodable(f"undecodable envelope: {error}") from error
        root, position = root_of(envelope, record.topic, record.partition, record.offset)
        decoded = _call("decode", self.pipeline.decode, envelope)
        values: list[tuple[Position, Any]] = [(position, decoded)]
        plan = _Plan(record, root, [], [])
        for index, step in enumerate(self.pipeline.steps):
            if isinstance(step, Map):
                values = [(pos, _call(step.id, step.fn, value)) for pos, value in values]
            elif isinstance(step, FlatMap):
                values = [
                    ((*pos, j), out)
                    for pos, value in values
                    for j, out in enumerate(_call(step.id, _listed, step.fn, value))
                ]
            elif isinstance(step, Aggregate):
                keyed = [(_key(step, value), pos, value) for pos, value in values]
                plan.folds.append((index, keyed))
            elif isinstance(step, Republish):
                plan.outputs.extend(self._republish(step, envelope, record, root, values))
        return plan

    def _republish(
        self,
        step: Republish,
        envelope: Envelope,
        record: ConsumedRecord,
        root: RootPartition,
        values: list[tuple[Position, Any]],
    ) -> list[Output]:
        outputs = []
        for j, (pos, value) in enumerate(values):
            out = Envelope(
                event_id=event_id(root, pos),
                event_time_ms=(
                    _call(step.id, step.event_time_ms, value)
                    if step.event_time_ms
                    else envelope.event_time_ms
                ),
                key=_call(step.id, step.key, value) if step.key else envelope.key,
                payload=_call(step.id, step.encode, value),
                payload_type=step.payload_type,
                source_chain=extended_chain(
                    envelope, record.topic, record.partition, record.offset, j
                ),
            )
            outputs.append(Output(step.topic, out.key.encode() or None, out.SerializeToString()))
        return outputs

    def _load_missing(self, plans: list[_Plan]) -> None:
        wanted: dict[int, set[str]] = {}
        for plan in plans:
            for step_index, keyed in plan.folds:
                table = self._table_of_step[step_index]
                wanted.setdefault(step_index, set()).update(
                    key for key, _, _ in keyed if key not in table.states
                )
        for step_index, keys in wanted.items():
            if not keys:
                continue
            table = self._table_of_step[step_index]
            ordered = sorted(keys)
            loaded = self._load(table.spec, ordered)
            for key in ordered:
                state = loaded.get(key)
                table.states[key] = state if state is not None else AggregateState(
                    _call(table.spec.id, table.spec.init)
                )

    def _apply(self, plan: _Plan, outcome: BatchOutcome) -> None:
        staged: dict[tuple[int, str], tuple[Any, Position]] = {}
        duplicates: Counter[str] = Counter()
        folded: Counter[str] = Counter()
        for step_index, keyed in plan.folds:
            table = self._table_of_step[step_index]
            spec = table.spec
            for key, pos, value in keyed:
                current = staged.get((step_index, key))
                if current is None:
                    state = table.states[key]
                    if state.is_duplicate(plan.root, pos):
                        duplicates[spec.id] += 1
                        continue
                    acc = state.value
                else:
                    acc, last = current
                    if pos <= last:
                        duplicates[spec.id] += 1
                        continue
                staged[(step_index, key)] = (_call(spec.id, spec.fold, acc, value), pos)
                folded[spec.id] += 1
        for (step_index, key), (value, pos) in staged.items():
            table = self._table_of_step[step_index]
            state = table.states[key]
            state.value = value
            state.watermarks[plan.root] = pos
            table.dirty.add(key)
        outcome.outputs.extend(plan.outputs)
        outcome.duplicates.update(duplicates)
        outcome.folded.update(folded)

    def _dead_letter(
        self, outcome: BatchOutcome, record: ConsumedRecord, reason: Exception
    ) -> None:
        outcome.dead_letters += 1
        outcome.outputs.append(
            Output(
                self._dead_letter_topic,
                None,
                record.value or b"",
                (
                    ("onceflow.reason", str(reason).encode()),
                    ("onceflow.pipeline", self.pipeline.id.encode()),
                    ("onceflow.source", f"{record.topic}/{record.partition}/{record.offset}"
                     .encode()),
                ),
            )
        )


class _Undecodable(Exception):
    """The record's bytes are not an Envelope."""


def _call(stage_id: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as error:
        raise StageFailure(stage_id, error) from error


def _listed(fn: Callable[[Any], Iterable[Any]], value: Any) -> list[Any]:
    return list(fn(value))


def _key(step: Aggregate, value: Any) -> str:
    key = _call(step.id, step.key, value)
    if not isinstance(key, str):
        raise StageFailure(step.id, TypeError(f"key must be str, got {type(key).__name__}"))
    return key
