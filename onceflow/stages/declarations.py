"""What a pipeline declares besides its steps: its windows, its producer dedup, the ids it
may not use.

Plain Python, never compiled (``onceflow.compiled``): users build, keep, copy
and pickle these values, and a class mypyc compiles cannot be copied or
pickled as a dataclass can. ``stages.windows`` and ``stages.producer_dedup``,
which are compiled, read them and export them too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

from typing_extensions import TypeVar

__all__ = ["DEFAULT_IDLE_RECORDS", "LOGS_STAGE", "MERGE_LOG_STAGE", "RESERVED_STAGES",
           "SEQUENCE_STAGE", "WINDOWS_STAGE", "Extract", "ProducerDedup", "Tumbling"]

#: The type of the values a declaration reads; ``Any`` where nothing tells it.
T = TypeVar("T", default=Any)

#: Stage ids under which the runtime keeps rows of its own beside the states, so no step
#: may take them: producer sequences (``stages.producer_dedup``), window watermarks and
#: open-window indexes (``stages.watermark``), log marks (``checkpoint.log_marks``), where
#: each co-partition's merge log is read from (``stages.merge_log.Start``).
SEQUENCE_STAGE = "__producer_seq__"
WINDOWS_STAGE = "__windows__"
LOGS_STAGE = "__logs__"
MERGE_LOG_STAGE = "__merge_log__"
RESERVED_STAGES = (SEQUENCE_STAGE, WINDOWS_STAGE, LOGS_STAGE, MERGE_LOG_STAGE)
#: Records of its partition after which a silent producer is forgotten (``ProducerDedup``).
DEFAULT_IDLE_RECORDS = 10_000_000
#: A header name, or a function of the record's parsed value (before ``decode``, so of no
#: type the pipeline knows); its answer may be anything, checked where it is read.
Extract = str | Callable[[Any], object]


@dataclass(frozen=True)
class Tumbling(Generic[T]):
    """Fixed, non-overlapping windows of ``size_ms``; ``event_time_ms`` reads a value's time."""

    size_ms: int
    # Any, not int: a user's function may answer anything, read through int() (the same
    # error for a bad answer, compiled or pure); compiled code checks hints at run time.
    event_time_ms: Callable[[T], Any]
    allowed_lateness_ms: int = 0
    #: A value more than this ahead of its record's Kafka timestamp is dead-lettered
    #: (``stages.watermark.future_bound``); None: the worker's ``onceflow.windows.max-future``.
    max_future_ms: int | None = None

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.allowed_lateness_ms < 0:
            raise ValueError("window size must be > 0 and allowed lateness >= 0")
        if self.max_future_ms is not None and (type(self.max_future_ms) is not int
                                               or self.max_future_ms < 0):
            raise ValueError(f"window max_future_ms: expected None or an integer >= 0, "
                             f"got {self.max_future_ms!r}")

    def start_of(self, ts: int) -> int:
        return ts - ts % self.size_ms

    def closes_at(self, start: int) -> int:
        """The event time at which the window starting at ``start`` closes."""
        return start + self.size_ms + self.allowed_lateness_ms


@dataclass(frozen=True)
class ProducerDedup:
    """Declares how a source record names its producer, sequence and (optionally) epoch.

    ``store`` keeps the tables (default: the first aggregate's store; a
    pipeline without aggregates must name one). ``idle_records``: a producer
    with no record among that many records of its partition (by offsets, which
    no producer's clock decides) is forgotten. ``idle_timeout_ms`` is the old
    rule's (by the records' Kafka timestamps, which the producers' clocks set):
    accepted, with a DeprecationWarning, and unused.
    """

    producer: Extract
    sequence: Extract
    epoch: Extract | None = None
    store: str | None = None
    idle_timeout_ms: int | None = None
    idle_records: int = DEFAULT_IDLE_RECORDS

    def __post_init__(self) -> None:
        for name in ("producer", "sequence", "epoch"):
            extract = getattr(self, name)
            if not (isinstance(extract, str) or callable(extract)
                    or (name == "epoch" and extract is None)):
                raise ValueError(f"dedup {name}: expected a header name or a function of the "
                                 f"parsed value, got {extract!r}")
        if type(self.idle_records) is not int or self.idle_records < 1:
            raise ValueError(f"dedup idle_records: expected a positive integer, "
                             f"got {self.idle_records!r}")
        if self.idle_timeout_ms is not None:
            warnings.warn("ProducerDedup(idle_timeout_ms=...) is unused: producers are "
                          "forgotten after idle_records records of their partition, not by "
                          "the timestamps their clocks set", DeprecationWarning, stacklevel=3)
