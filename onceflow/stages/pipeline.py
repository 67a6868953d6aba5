"""The user-facing pipeline: frozen, inert stage specs with mandatory ids.

A pipeline is data that the runtime interprets. Ids key persisted state
(``<pipeline>:<stage>:<key>``), metrics and dead letters, so they must be
unique and must not change between deployments of the same pipeline.

``Pipeline[T]`` is generic in the type of the values its next step gets, so
mypy checks each step's function against the one before it: ``map`` and
``flat_map`` change ``T``, the other steps pass their values on unchanged.
``T`` is ``Any`` where nothing says it (no ``decode``, or after a ``repartition``
without one). The engine reads the steps as ``Map[Any, Any]`` and so on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, overload

from onceflow.stages.declarations import RESERVED_STAGES, ProducerDedup, Tumbling
from onceflow.stages.formats import Format, check_format
from onceflow.stages.formats import json_bytes as json_bytes  # the default encode, kept here
from onceflow.stages.formats import payload_bytes as payload_bytes  # the default decode, kept here
from onceflow.stages.join_step import Join as Join
from onceflow.stages.join_step import R
from onceflow.stages.join_step import Table as Table
from onceflow.stages.record_meta import RecordMeta
from onceflow.stages.republish_step import OUTPUT_FORMATS as OUTPUT_FORMATS
from onceflow.stages.republish_step import PartitionMap as PartitionMap
from onceflow.stages.republish_step import Republish as Republish
from onceflow.stages.republish_step import same_partition as same_partition
from onceflow.stages.steps import Aggregate as Aggregate
from onceflow.stages.steps import Filter as Filter
from onceflow.stages.steps import FlatMap as FlatMap
from onceflow.stages.steps import Map as Map
from onceflow.stages.steps import Repartition as Repartition
from onceflow.stages.steps import S, T, U, expiry_seconds
from onceflow.stages.steps import Step as Step

__all__ = ["OUTPUT_FORMATS", "Aggregate", "Filter", "FlatMap", "Join", "Map", "PartitionMap",
           "Pipeline", "Repartition", "Republish", "Step", "Table", "json_bytes", "payload_bytes",
           "same_partition"]

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True)
class Pipeline(Generic[T]):
    """Source topics, their format, a decoder, then steps; build it with the chaining methods.

    ``format`` says what the source topics hold (``formats`` per topic
    overrides it): ``"envelope"`` (onceflow's records, the default),
    ``"json"``, ``"bytes"``, ``"str"``, or a ``Callable[[bytes], Any]``
    deserializer. ``decode`` gets the envelope (default: its payload bytes)
    or the parsed value of a raw format (default: unchanged). A record that
    does not parse in its topic's format is dead-lettered with the reason.
    With ``with_meta=True`` the first step gets ``(value, meta)``, where meta
    is a ``RecordMeta`` (key, headers, timestamp, topic, partition, offset,
    and the envelope if there is one); records from repartition topics do not.
    ``dedup`` (a ``ProducerDedup``) drops the source records a producer sent
    twice, by producer id and sequence (see ``onceflow.stages.producer_dedup``).

    Example:
        >>> p = (Pipeline("robots", topics=("reports",))
        ...      .flat_map("explode", lambda r: r)
        ...      .aggregate("count", key=str, init=lambda: 0, fold=lambda s, _: s + 1))
        >>> [s.id for s in p.steps]
        ['explode', 'count']
    """

    id: str
    topics: tuple[str, ...]
    decode: Callable[[Any], Any] | None = None
    steps: tuple[Step, ...] = field(default=())
    format: Format = "envelope"
    formats: Mapping[str, Format] = field(default_factory=dict)
    with_meta: bool = False
    dedup: ProducerDedup | None = None

    if TYPE_CHECKING:  # what T is at the source, for mypy; the dataclass makes __init__
        @overload
        def __init__(self: Pipeline[U], id: str, topics: tuple[str, ...],
                     decode: Callable[[Any], U] | None = None, steps: tuple[Step, ...] = (),
                     format: Format = "envelope", formats: Mapping[str, Format] = ...,
                     with_meta: Literal[False] = False, dedup: ProducerDedup | None = None
                     ) -> None: ...
        @overload
        def __init__(self: Pipeline[tuple[U, RecordMeta]], id: str, topics: tuple[str, ...],
                     decode: Callable[[Any], U] | None = None, steps: tuple[Step, ...] = (),
                     format: Format = "envelope", formats: Mapping[str, Format] = ..., *,
                     with_meta: Literal[True], dedup: ProducerDedup | None = None) -> None: ...
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    def __post_init__(self) -> None:
        _check_id("pipeline", self.id)
        if isinstance(self.topics, str) or not self.topics:
            raise ValueError(f"pipeline {self.id!r}: topics must be a non-empty tuple of names")
        check_format(f"pipeline {self.id!r}", self.format)
        for topic, fmt in self.formats.items():
            if topic not in self.topics:
                raise ValueError(f"pipeline {self.id!r}: formats names {topic!r}, which is not "
                                 f"one of its topics {list(self.topics)}")
            check_format(f"pipeline {self.id!r}: topic {topic!r}", fmt)
        seen: set[str] = set()
        # Reserved: producer sequences, window watermarks, log marks (checkpoint.log_marks).
        for step in self.steps:
            _check_id(type(step).__name__.lower(), step.id)
            if step.id in seen or step.id in RESERVED_STAGES:
                raise ValueError(f"pipeline {self.id!r}: duplicate stage id {step.id!r}")
            seen.add(step.id)
        hops = [step.topic for step in self.repartitions]
        for hop in self.repartitions:
            if hop.topic in self.topics or hops.count(hop.topic) > 1:
                raise ValueError(f"pipeline {self.id!r}: repartition topic {hop.topic!r} must "
                                 "differ from the source topics and every other repartition topic")
            if hop.partitions is not None and hop.partitions < 1:
                raise ValueError(f"pipeline {self.id!r}: repartition {hop.id!r}: partitions "
                                 f"must be at least 1, got {hop.partitions}")
        writers = [s.topic for s in self.steps if isinstance(s, Republish | Repartition)]
        for step, _ in self.exclusive_outputs:
            if writers.count(step.topic) > 1 or step.topic in self.consumed_topics:
                raise ValueError(f"pipeline {self.id!r}: republish {step.id!r}: its exclusive "
                                 f"topic {step.topic!r} must be written by no other step and "
                                 "read by none of this pipeline")
        _check_units(self.id, self.steps)
        _check_joins(self)

    def map(self, id: str, fn: Callable[[T], U]) -> Pipeline[U]:
        """Turn each value into one new value; ``fn`` must be deterministic."""
        return self._then(Map(id, fn))

    def filter(self, id: str, predicate: Callable[[T], bool]) -> Pipeline[T]:
        """Keep only the values for which ``predicate`` is true (the rest are dropped,
        not dead-lettered); ``predicate`` must be deterministic."""
        return self._then(Filter(id, predicate))

    def flat_map(self, id: str, fn: Callable[[T], Iterable[U]]) -> Pipeline[U]:
        """Turn each value into 0..n values that travel on as one unit.

        Each output gets a fan-out index after its input's position, so the
        outputs of one input are folded (and deduplicated) together; ``fn``
        must return the same values in the same order when replayed.
        """
        return self._then(FlatMap(id, fn))

    def aggregate(
        self,
        id: str,
        *,
        key: Callable[[T], str],
        init: Callable[[], S],
        fold: Callable[[S, T], S],
        store: str = "redis",
        window: Tumbling[T] | None = None,
        schema: Any = None,
        expire_after: timedelta | float | None = None,
    ) -> Pipeline[T]:
        """Fold values into a state per ``key(value)``, exactly once per input event.

        ``init()`` makes a new key's state and ``fold(state, value)`` returns the
        next one without mutating it (states must be JSON-serializable). The
        state lives in ``store`` (``redis`` or ``cassandra``) with the watermarks
        that discard replays; with ``window`` it is kept per tumbling event-time
        window. Values it folds pass on to later steps; replays and late values
        go no further. Each key must be fed from one input partition when
        several workers run the pipeline (see ``repartition``). ``schema`` (a
        dataclass, TypedDict, Spark type or int/float/str/bool) types the value
        (per window, if windowed) in analytics instead of inferring it.

        ``expire_after`` (a ``timedelta`` or seconds, 1s..7300d; 0: never; None: the
        worker's ``onceflow.state.expire-after``): a key not folded for that long loses
        its state, watermarks included, and starts again from ``init()`` (a windowed key
        only once its last window closed). It must exceed the input topics' retention,
        or the longest replay you allow: a replay of older events would count them again.
        """
        seconds = None if expire_after is None else expiry_seconds(f"aggregate {id!r}",
                                                                   expire_after)
        return self._then(Aggregate(id, key, init, fold, store, window, schema, seconds))

    def deduplicate(self, id: str, *, key: Callable[[T], str], store: str = "redis"
                    ) -> Pipeline[T]:
        """Let each event through once: drop the copies a re-keying republisher re-sent.

        An aggregate counting the events per ``key``; its per-route watermarks
        recognise a copy, so each key must be fed from one partition
        (``onceflow.stages.cleanup`` says why that suffices, and builds the
        usual pipeline around it).
        """
        return self.aggregate(id, key=key, init=_zero, fold=_plus_one, store=store)

    def republish(
        self,
        id: str,
        topic: str,
        *,
        encode: Callable[[T], bytes] = json_bytes,
        key: Callable[[T], str] | None = None,
        event_time_ms: Callable[[T], int] | None = None,
        payload_type: str = "",
        exclusive: bool = False,
        partition: PartitionMap | str | None = None,
        format: str = "envelope",
        unit: bool = False,
    ) -> Pipeline[T]:
        """Produce each value to ``topic`` as an envelope whose source chain grows by one.

        ``encode`` makes the payload (default: compact JSON), ``key`` the Kafka
        key, a ``str`` (default: the input envelope's key, or a raw record's
        Kafka key read as UTF-8; any other type is a dead letter, as for an
        aggregate key), ``event_time_ms`` the event time: the envelope's
        ``event_time_ms`` and a plain output's ``onceflow-event-time-ms``
        header (default: the input's; for a raw record not written by onceflow
        that is its Kafka timestamp, 0 if none, not a time in the value).
        Aggregates downstream, in this or another pipeline, dedup on the
        chain's root, so a republisher that re-sends after a crash double
        counts nothing.

        ``exclusive=True``: outputs go to ``partition(input topic, input
        partition)`` (default: the input's partition number) and this step is
        their partitions' only writer, so after a crash it skips what is
        already in the topic and the topic holds each output once.
        ``partition`` is ``"key"`` (the default without ``exclusive``) or such
        a function. ``format="json"`` or ``"bytes"`` writes ``encode(value)``
        as the record value with the origin in headers, for consumers that
        know nothing of onceflow.

        ``unit=True``: the consecutive outputs of one input that share a key
        travel as one record (fewer records to produce and consume; readers
        expand it into the same values at the same positions). Not with
        ``exclusive``, a plain ``format``, or after an aggregate.
        """
        if partition is None:
            partition = same_partition if exclusive else "key"
        return self._then(Republish(id, topic, encode, key, event_time_ms, payload_type,
                                    exclusive, partition, format, unit))

    @overload
    def repartition(self, id: str, *, key: Callable[[T], str], partitions: int | None = None,
                    topic: str | None = None, encode: Callable[[T], bytes] = json_bytes
                    ) -> Pipeline[Any]: ...
    @overload
    def repartition(self, id: str, *, key: Callable[[T], str], partitions: int | None = None,
                    topic: str | None = None, encode: Callable[[T], bytes] = json_bytes,
                    decode: Callable[[bytes], U]) -> Pipeline[U]: ...
    def repartition(
        self,
        id: str,
        *,
        key: Callable[[T], str],
        partitions: int | None = None,
        topic: str | None = None,
        encode: Callable[[T], bytes] = json_bytes,
        decode: Callable[[bytes], Any] = json.loads,
    ) -> Pipeline[Any]:
        """Re-key by ``key`` through a topic before an aggregate keyed differently from the input.

        The topic is ``<pipeline>-<id>-repartition`` unless ``topic`` names
        one; a worker creates it at start when missing, with ``partitions``
        (default: as many as the source topic with the most). Keep ``key``
        consistent with the next aggregate's key, and values JSON-friendly or
        give ``encode``/``decode``. The values after the hop are what ``decode``
        answers (``Any`` for the default, JSON).
        """
        name = topic if topic is not None else f"{self.id}-{id}-repartition"
        return self._then(Repartition(id, key, name, partitions, encode, decode))

    def join(self, id: str, *, table: Table[R], on: Callable[[T], str],
             merge: Callable[[T, R | None], U], missing: Literal["merge", "drop"] = "merge"
             ) -> Pipeline[U]:
        """Enrich each value with its key's row of ``table``: ``merge(value, row)``.

        ``on(value)`` is the key; a key without a row gets ``merge(value, None)``, or is
        dropped with ``missing="drop"``. The table is kept as onceflow state (the latest
        row per key, with the watermarks that discard a replayed table record), and a
        merge log fixes the order in which stream and table records were applied, so a
        replay after a crash meets the same row as the first run (docs/guide/joins.md).
        The table topic must have as many partitions as the topics feeding the join and
        be keyed by the join key (``repartition`` first if the stream is not).
        """
        return self._then(Join(id, table, on, merge, missing))

    def format_of(self, topic: str) -> Format:
        """The declared format of source or table topic ``topic`` (repartition topics hold
        envelopes)."""
        if topic not in self.topics:
            tables = {join.table.topic: join.table.format for join, _ in self.joins}
            return tables.get(topic, "envelope")
        return self.formats.get(topic, self.format)

    @property
    def aggregates(self) -> tuple[Aggregate, ...]:
        return tuple(s for s in self.steps if isinstance(s, Aggregate))

    @property
    def dedup_store(self) -> str | None:
        """Where the producer sequences live: ``dedup.store``, else the first aggregate's."""
        if self.dedup is None:
            return None
        return self.dedup.store or next((spec.store for spec in self.aggregates), None)

    @property
    def repartitions(self) -> tuple[Repartition, ...]:
        return tuple(s for s in self.steps if isinstance(s, Repartition))

    @property
    def republished_to(self) -> tuple[str, ...]:
        """The topics its republish steps write (sorted): what pipelines downstream read."""
        return tuple(sorted({s.topic for s in self.steps if isinstance(s, Republish)}))

    @property
    def exclusive_outputs(self) -> tuple[tuple[Republish, tuple[str, ...]], ...]:
        """Each exclusive republish step with the topics its input records come from."""
        found = []
        inputs = self.topics
        for step in self.steps:
            if isinstance(step, Repartition):
                inputs = (step.topic,)
            elif isinstance(step, Republish) and step.exclusive:
                found.append((step, inputs))
        return tuple(found)

    @property
    def joins(self) -> tuple[tuple[Join, tuple[str, ...]], ...]:
        """Each join step with the topics its values come from (its stream side)."""
        found = []
        inputs = self.topics
        for step in self.steps:
            if isinstance(step, Repartition):
                inputs = (step.topic,)
            elif isinstance(step, Join):
                found.append((step, inputs))
        return tuple(found)

    @property
    def consumed_topics(self) -> tuple[str, ...]:
        """The source topics, every repartition topic, then every join's table topic: what a
        worker subscribes to."""
        return (*self.topics, *(step.topic for step in self.repartitions),
                *(join.table.topic for join, _ in self.joins))

    def _then(self, step: Step) -> Pipeline[Any]:
        return replace(self, steps=(*self.steps, step))


def _zero() -> int:
    return 0


def _plus_one(count: int, _: Any) -> int:
    return count + 1


def _check_units(pipeline_id: str, steps: tuple[Step, ...]) -> None:
    """Refuse a unit republish after an aggregate of its segment: the aggregate may stop
    some of a record's values (replays, late ones), and a unit cannot lose some items."""
    folds = False
    for step in steps:
        folds = (folds or isinstance(step, Aggregate)) and not isinstance(step, Repartition)
        if isinstance(step, Republish) and step.unit and folds:
            raise ValueError(f"pipeline {pipeline_id!r}: republish {step.id!r}: unit=True "
                             "after an aggregate is not supported (the aggregate may stop "
                             "some of a record's values): use unit=False")


def _check_joins(pipeline: Pipeline[Any]) -> None:
    """A table topic is read by its join only; dedup would read a batch ahead of the merge
    order (``producer_dedup``), which the join cannot keep."""
    tables = [join.table.topic for join, _ in pipeline.joins]
    for join, _ in pipeline.joins:
        topic = join.table.topic
        if tables.count(topic) > 1 or topic in pipeline.topics or \
                topic in (step.topic for step in pipeline.steps
                          if isinstance(step, Republish | Repartition)):
            raise ValueError(f"pipeline {pipeline.id!r}: join {join.id!r}: its table topic "
                             f"{topic!r} must be no source topic, no output and no other "
                             "join's table")
    if tables and pipeline.dedup is not None:
        raise ValueError(f"pipeline {pipeline.id!r}: a join with dedup= is not supported yet")


def _check_id(kind: str, value: str) -> None:
    if not isinstance(value, str) or not _ID.match(value):
        raise ValueError(f"{kind} id {value!r}: expected 1-100 of [A-Za-z0-9_.-]")
