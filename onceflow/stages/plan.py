"""One consumed record after the stateless steps: what each aggregate folds of it and
what each republish step emits, in pipeline order (``stages.runner`` plans, then
applies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.lineage import Position, RootPartition, Route
from onceflow.stages.outcome import ConsumedRecord, Output
from onceflow.stages.state import StateTable

#: A record parsed, deduplicated and decoded: its envelope (if any), root, route, and its
#: first values with their positions (parallel lists).
Head = tuple[Envelope | None, RootPartition, Route, list[Any], list[Position]]


@dataclass(slots=True)
class Plan:
    """One record after the stateless steps: what it folds and what it emits."""

    record: ConsumedRecord
    root: RootPartition
    route: Route  # the watermark key (lineage: the path, not just the root)
    order: list[Fold | Emit]  # what it folds and what it emits, in pipeline order


@dataclass(slots=True)
class Fold:
    """One aggregate's share of a record: parallel lists, one entry per value."""

    table: StateTable
    keys: list[Any]
    positions: list[Position]
    values: list[Any]


@dataclass(slots=True)
class Emit:
    """A republish step's outputs, one per value, with the values' positions."""

    positions: list[Position]
    outputs: list[Output]


def is_stopped(position: Position, stopped: list[tuple[int, set[Position]]]) -> bool:
    """True if ``position`` derives from a value an earlier aggregate did not fold."""
    return any(position[:length] in positions for length, positions in stopped)
