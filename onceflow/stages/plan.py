"""One consumed record after the stateless steps: what each aggregate folds of it and
what each republish step emits, in pipeline order (``stages.runner`` plans, then
applies)."""

from __future__ import annotations

from typing import Any

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.lineage import Position, RootPartition, Route
from onceflow.stages.outcome import ConsumedRecord, Output
from onceflow.stages.state_table import StateTable

#: A record parsed, deduplicated and decoded: its envelope (if any), root, route, and its
#: first values with their positions (parallel lists).
Head = tuple[Envelope | None, RootPartition, Route, list[Any], list[Position]]


class Plan:
    """One record after the stateless steps: what it folds and what it emits."""

    __slots__ = ("order", "record", "root", "route")

    def __init__(self, record: ConsumedRecord, root: RootPartition, route: Route,
                 order: list[Fold | Emit]):
        self.record = record
        self.root = root
        self.route = route  # the watermark key (lineage: the path, not just the root)
        self.order = order  # what it folds and what it emits, in pipeline order


class Fold:
    """One aggregate's share of a record: parallel lists, one entry per value."""

    __slots__ = ("keys", "positions", "table", "values")

    def __init__(self, table: StateTable, keys: list[Any], positions: list[Position],
                 values: list[Any]):
        self.table = table
        self.keys = keys
        self.positions = positions
        self.values = values


class Emit:
    """A republish step's outputs, one per value, with the values' positions."""

    __slots__ = ("outputs", "positions")

    def __init__(self, positions: list[Position], outputs: list[Output]):
        self.positions = positions
        self.outputs = outputs

