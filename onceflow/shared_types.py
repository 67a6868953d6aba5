"""The types every layer shares: a partition's name, a consumed Kafka record, a chain's hop.

Defined once here, below both the user's API and the engine, so neither has to
import the other for them. The older homes re-export them
(``onceflow.stages.state.TopicPartition``, ``onceflow.stages.outcome.ConsumedRecord``).
aiokafka's own ``TopicPartition`` (a named tuple) is imported as ``KafkaPartition``
where the Kafka clients are driven; everywhere else a partition is this plain tuple.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["ConsumedHeader", "ConsumedRecord", "Hop", "TopicPartition"]

#: A topic's partition as (topic, partition number): keys of offsets, epochs, homes.
TopicPartition = tuple[str, int]

#: A hop of an envelope's source chain as plain values: topic, partition, offset, fan-out
#: index (``onceflow.stages.lineage``; a ``TestRun`` input's ``chain``).
Hop = tuple[str, int, int, int]

#: A consumed record's header: Kafka allows a null value (those onceflow produces,
#: ``onceflow.stages.outcome.Output.headers``, have none).
ConsumedHeader = tuple[str, bytes | None]


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
    @property
    def key(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[ConsumedHeader]: ...
    @property
    def timestamp(self) -> int | None: ...
