"""Aggregate state with its watermarks, and its one-value encoding.

A state and the watermarks of everything folded into it are encoded into
one value, so a store writes both in one atomic write. The value also names
the state's *home*: the one input partition allowed to feed it when the
pipeline may run on several workers (``onceflow.stages.runner``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from onceflow.stages.lineage import Position, RootPartition

if TYPE_CHECKING:
    from onceflow.stages.pipeline import Aggregate

TopicPartition = tuple[str, int]


class AggregateState:
    """The folded value of one key plus, per root partition, the highest position folded."""

    __slots__ = ("home", "value", "watermarks")

    def __init__(self, value: Any, watermarks: dict[RootPartition, Position] | None = None,
                 home: TopicPartition | None = None):
        self.value = value
        self.watermarks: dict[RootPartition, Position] = watermarks or {}
        self.home = home

    def __repr__(self) -> str:
        return f"AggregateState({self.value!r}, {self.watermarks!r}, home={self.home!r})"


def encode_state(state: AggregateState) -> bytes:
    marks = [[topic, partition, list(pos)] for (topic, partition), pos in state.watermarks.items()]
    doc: dict[str, Any] = {"v": state.value, "w": marks}
    if state.home is not None:
        doc["h"] = list(state.home)
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_state(data: bytes) -> AggregateState:
    doc = json.loads(data)
    marks = {(topic, partition): tuple(pos) for topic, partition, pos in doc["w"]}
    home = doc.get("h")
    return AggregateState(doc["v"], marks, None if home is None else (home[0], home[1]))


class StateTable:
    """The in-memory states of one aggregate and which of them changed."""

    def __init__(self, spec: Aggregate):
        self.spec = spec
        self.states: dict[str, AggregateState] = {}
        self.dirty: set[str] = set()
        self.closed: dict[tuple[str, int], Any] = {}  # windows closed since the last snapshot

    def take_dirty(self) -> dict[str, AggregateState]:
        taken = {key: self.states[key] for key in self.dirty}
        self.dirty = set()
        return taken

    def take_closed(self) -> dict[tuple[str, int], Any]:
        """Closed windows (key, start) -> final value, to be written before the states."""
        taken, self.closed = self.closed, {}
        return taken
