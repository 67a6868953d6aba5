"""A republish step's spec: where the values at this point of a pipeline go, and how.

Kept apart from ``pipeline`` (which re-exports it): the checks of what a
republish may combine (partition maps, exclusive outputs, formats, units)
are a concept of their own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

from typing_extensions import TypeVar

__all__ = ["OUTPUT_FORMATS", "PartitionMap", "Republish", "same_partition"]

#: The type of the values republished; ``Any`` where nothing tells it.
T = TypeVar("T", default=Any)
#: An output partition as a function of the input record's (topic, partition).
PartitionMap = Callable[[str, int], int]
#: What a republish step writes: onceflow envelopes, or the plain encoded value.
OUTPUT_FORMATS = ("envelope", "json", "bytes")


def same_partition(topic: str, partition: int) -> int:
    """The default partition map of an exclusive republish: output partition = input's."""
    return partition


@dataclass(frozen=True)
class Republish(Generic[T]):
    """Produce the values at this point to ``topic``, extending the source chain.

    ``partition``: ``"key"`` (Kafka's default partitioner over the key) or a
    ``PartitionMap``. ``exclusive``: this step is the only writer of its
    output partitions, so a restarted worker reads their tails and skips
    what is already there (``onceflow.stages.tail_scan``). ``format``:
    ``"envelope"``, or ``"json"``/``"bytes"`` for the plain encoded value
    with the origin in headers (``onceflow.stages.origin``). ``unit``: a
    consumed record's consecutive outputs with one key travel as one record
    (``onceflow.stages.units``).
    """

    id: str
    topic: str
    encode: Callable[[T], bytes]
    key: Callable[[T], str] | None = None
    event_time_ms: Callable[[T], int] | None = None
    payload_type: str = ""
    exclusive: bool = False
    partition: PartitionMap | str = "key"
    format: str = "envelope"
    unit: bool = False

    def __post_init__(self) -> None:
        owner = f"republish {self.id!r}"
        if self.format not in OUTPUT_FORMATS:
            raise ValueError(f"{owner}: format {self.format!r}: expected one of "
                             f"{', '.join(OUTPUT_FORMATS)}")
        if self.unit and self.format != "envelope":
            raise ValueError(f"{owner}: unit=True writes several values in one envelope; "
                             f"format {self.format!r} holds one value per record: leave "
                             "format='envelope' or unit=False")
        if self.unit and self.exclusive:
            raise ValueError(f"{owner}: unit=True with exclusive=True is not supported (the "
                             "restart's output tail scan reads one output per record): "
                             "choose one")
        if isinstance(self.partition, str):
            if self.partition != "key":
                raise ValueError(f"{owner}: partition {self.partition!r}: expected 'key' or a "
                                 "function (input topic, input partition) -> output partition")
            if self.exclusive:
                raise ValueError(
                    f"{owner}: exclusive=True needs each output partition to be a function of "
                    "the input partition, and partition='key' spreads one input partition's "
                    "outputs over every output partition (several writers each): give "
                    "partition=<function (topic, partition) -> partition> or leave it unset")
            return
        if not callable(self.partition):
            raise ValueError(f"{owner}: partition must be 'key' or a function "
                             "(input topic, input partition) -> output partition")
        try:
            inspect.signature(self.partition).bind("topic", 0)
        except TypeError as error:
            raise ValueError(f"{owner}: partition must be a function of the input (topic, "
                             f"partition) only, it cannot take two arguments: {error}") from None
        except ValueError:  # a builtin without a signature: trust it
            pass

    def partition_of(self, topic: str, partition: int) -> int | None:
        """The output partition of records consumed from topic/partition; None: by key."""
        if isinstance(self.partition, str):
            return None
        return self.partition(topic, partition)
