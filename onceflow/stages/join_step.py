"""A join step's spec: enrich each value with the current row of a table topic.

Kept apart from ``steps`` (which re-exports it): the table and what a join may
combine are a concept of their own. The engine (``stages.join_runner``) keeps the
table as onceflow state and orders the two inputs by a merge log
(docs/architecture.md, "Joins: the merge log").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal

from typing_extensions import TypeVar

from onceflow.stages.formats import Format, check_format

__all__ = ["MISSING_ROWS", "Join", "Table"]

#: The values the join gets (``Any`` where nothing tells them).
T = TypeVar("T", default=Any)
#: A table's row.
R = TypeVar("R", default=Any)
#: The values the join makes.
U = TypeVar("U", default=Any)
#: What a join does with a value whose key has no row: ``merge(value, None)``, or drop it.
MISSING_ROWS = ("merge", "drop")


def _itself(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Table(Generic[R]):
    """A topic whose latest record per key is a row (a compacted topic, as a KTable).

    ``key`` makes the row's key from the parsed value (default: the record's Kafka key
    read as UTF-8), ``value`` the row (default: the parsed value; JSON-serializable).
    A record without a value (a tombstone) deletes its key's row. The topic must have
    as many partitions as the stream it is joined with, and be keyed by the join key.
    """

    topic: str
    key: Callable[[Any], str] | None = None
    value: Callable[[Any], R] = _itself
    format: Format = "json"
    store: str = "redis"

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ValueError(f"table {self.topic!r}: topic must be a non-empty name")
        check_format(f"table {self.topic!r}", self.format)


@dataclass(frozen=True)
class Join(Generic[T, R, U]):
    """``merge(value, row)``: the value with its table row as the merge log orders them.

    ``on(value)`` is the table key to look up. A replay after a crash meets the same
    version of the row as the first run did. ``missing="drop"`` lets a value whose key
    has no row go no further (not a dead letter); ``"merge"`` calls ``merge(value, None)``.
    ``merge`` must be deterministic and must not mutate its inputs.
    """

    id: str
    table: Table[R]
    on: Callable[[T], str]
    merge: Callable[[T, R | None], U]
    missing: Literal["merge", "drop"] = "merge"

    def __post_init__(self) -> None:
        if self.missing not in MISSING_ROWS:
            raise ValueError(f"join {self.id!r}: missing={self.missing!r}: expected one of "
                             f"{', '.join(MISSING_ROWS)}")
