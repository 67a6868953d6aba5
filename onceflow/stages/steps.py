"""The steps a pipeline is made of: frozen, inert specs (``Map``, ``Filter``, ``FlatMap``,
``Aggregate``, ``Repartition``; ``Republish`` in ``republish_step``), generic in the values
they take and make, so mypy checks each user function against the step before it.
``Pipeline`` (``stages.pipeline``) builds them; the engine reads them as ``Map[Any, Any]``
and so on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic

from typing_extensions import TypeVar

from onceflow.stages.declarations import Tumbling
from onceflow.stages.formats import json_bytes
from onceflow.stages.join_step import Join
from onceflow.stages.republish_step import Republish

__all__ = ["MAX_EXPIRY", "Aggregate", "Filter", "FlatMap", "Map", "Repartition", "Step",
           "expiry_seconds"]

#: The values a step gets (``Any`` where nothing tells them).
T = TypeVar("T", default=Any)
#: The values a step makes.
U = TypeVar("U", default=Any)
#: An aggregate's state.
S = TypeVar("S", default=Any)

@dataclass(frozen=True)
class Map(Generic[T, U]):
    """One input value becomes one output value."""

    id: str
    fn: Callable[[T], U]


@dataclass(frozen=True)
class Filter(Generic[T]):
    """Keep the values for which ``predicate`` is true; the others go no further.

    A dropped value is not a dead letter: it is simply not wanted. Values
    that pass keep their positions, so dedup downstream is unchanged.
    """

    id: str
    predicate: Callable[[T], bool]


@dataclass(frozen=True)
class FlatMap(Generic[T, U]):
    """One input value becomes 0..n values that travel on as one unit.

    The outputs keep the input's origin and get a fan-out index each, so
    they are folded (and deduplicated) together, never half-applied.
    """

    id: str
    fn: Callable[[T], Iterable[U]]


@dataclass(frozen=True)
class Aggregate(Generic[T, S]):
    """A non-idempotent fold per key, guarded by per-root-partition watermarks.

    ``fold`` must return the new state and must not mutate its input: a unit
    that fails half-way is rolled back by discarding the new states. States
    must be JSON-serializable. Values it folds pass on unchanged to later
    stages; replays it discards (and late values) travel no further.

    With ``window``, the state is kept per tumbling event-time window; closed
    windows are persisted as history rows (see ``onceflow.stages.windows``).

    ``expire_after`` (seconds): a state not folded for that long is removed by the store
    (and from the cache), its watermarks with it; None takes ``onceflow.state.expire-after``,
    0 never expires (``Pipeline.aggregate`` also takes a ``timedelta``).
    """

    id: str
    key: Callable[[T], str]
    init: Callable[[], S]
    fold: Callable[[S, T], S]
    store: str = "redis"
    window: Tumbling[T] | None = None
    schema: Any = None  # the value's type for analytics (onceflow.analytics.schemas)
    expire_after: float | None = None

    def __post_init__(self) -> None:
        if self.expire_after is not None:
            object.__setattr__(self, "expire_after",
                               expiry_seconds(f"aggregate {self.id!r}", self.expire_after))


@dataclass(frozen=True)
class Repartition(Generic[T, U]):
    """Re-key the values through ``topic`` so every key is fed from one partition.

    An aggregate's state lives in one worker at a time only if all of its
    key's values arrive through one input partition. When the aggregate key
    is not the input's partitioning key, this step produces the values to
    ``topic`` keyed by ``key`` (so Kafka puts each key in one partition) and
    the pipeline goes on from that topic, in the same workers and consumer
    group, exactly once through the hop (source chains and per-root
    watermarks, as for ``republish``). Values cross the hop as ``encode``
    (JSON by default) and come back through ``decode``.
    """

    id: str
    key: Callable[[T], str]
    topic: str
    partitions: int | None = None  # None: as many as the source topic with the most
    encode: Callable[[T], bytes] = json_bytes
    decode: Callable[[bytes], U] = json.loads


Step = Map | Filter | FlatMap | Aggregate | Republish | Repartition | Join



#: The longest state expiry: Cassandra's largest TTL (20 years), in seconds.
MAX_EXPIRY = 7300 * 86400


def expiry_seconds(what: str, value: object) -> float:
    """``expire_after`` as seconds: 0 (never) or 1s..7300d, from a ``timedelta`` or a
    number (Redis expires by the millisecond, Cassandra by the whole second, rounded up)."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not math.isfinite(seconds) or not (seconds == 0 or 1 <= seconds <= MAX_EXPIRY):
        raise ValueError(f"{what}: expire_after: expected 0 (never), or a timedelta or "
                         f"seconds in 1s..7300d, got {value!r}")
    return float(seconds)
