"""A pipeline's steps compiled once into the segments the runner loops over per record.

A repartition step ends one segment and starts the next: the source topics
feed the first, each repartition topic the next, and the runner picks a
record's segment by the topic it was consumed from. Each step becomes a
tuple whose kind is compared by identity, and whose function (map, filter
predicate, flat-map, aggregate key) is at hand: cheaper in the per-record
loop than an ``isinstance`` chain and attribute lookups per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from onceflow.stages.lineage import Position
from onceflow.stages.pipeline import (
    Aggregate,
    Filter,
    FlatMap,
    Map,
    Pipeline,
    Repartition,
    Republish,
    Step,
)
from onceflow.stages.state_table import StateTable

MAP, FILTER, FLAT_MAP, AGGREGATE, REPUBLISH = range(5)
KINDS = {Map: MAP, Filter: FILTER, FlatMap: FLAT_MAP, Aggregate: AGGREGATE, Republish: REPUBLISH}

#: One step as the loop runs it: (kind, stage id, its function (fn, predicate or key; None
#: for a republish), its table (aggregates), the step itself (for a republish)).
Compiled = tuple[int, str, "Callable[[Any], Any] | None", "StateTable | None", Step]
Segment = list[Compiled]


def segments(pipeline: Pipeline, tables: Sequence[StateTable]) -> dict[str, Segment]:
    """Consumed topic -> its segment; ``tables`` are the aggregates' tables, in order."""
    remaining = iter(tables)
    segment: Segment = []
    found = dict.fromkeys(pipeline.topics, segment)
    for step in pipeline.steps:
        if isinstance(step, Repartition):
            hop = Republish(step.id, step.topic, step.encode, step.key)
            segment.append((REPUBLISH, step.id, None, None, hop))
            segment = found[step.topic] = []
            continue
        fn: Callable[[Any], Any] | None = None
        if isinstance(step, Map | FlatMap):
            fn = step.fn
        elif isinstance(step, Filter):
            fn = step.predicate
        elif isinstance(step, Aggregate):
            fn = step.key
        table = next(remaining) if isinstance(step, Aggregate) else None
        segment.append((KINDS[type(step)], step.id, fn, table, step))
    return found


def through(kind: int, fn: Callable[[Any], Any], values: list[Any], positions: list[Position]
            ) -> tuple[list[Any], list[Position]]:
    """One map, filter or flat-map step over parallel lists of values and their positions.

    A flat-map's ``j``-th output of a value at ``pos`` is at ``(*pos, j)``.
    """
    if kind is MAP:
        return [fn(value) for value in values], positions
    if kind is FILTER:
        kept = [bool(fn(value)) for value in values]
        return ([value for value, keep in zip(values, kept, strict=True) if keep],
                [pos for pos, keep in zip(positions, kept, strict=True) if keep])
    assert kind is FLAT_MAP
    if len(values) == 1:  # the usual case: one input value
        outs = list(fn(values[0]))
        pos = positions[0]
        return outs, [pos + (j,) for j in range(len(outs))]  # noqa: RUF005
    fanned = [list(fn(value)) for value in values]
    return ([out for outs in fanned for out in outs],
            [pos + (j,) for pos, outs in zip(positions, fanned, strict=True)  # noqa: RUF005
             for j in range(len(outs))])
