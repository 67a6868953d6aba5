"""Aggregate state with its watermarks, and its one-value encoding.

A state and the watermarks of everything folded into it are encoded into
one value, so a store writes both in one atomic write. The value also names
the state's *home*: the one input partition allowed to feed it when the
pipeline may run on several workers (``onceflow.stages.runner``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, cast

import orjson

from onceflow.shared_types import TopicPartition as TopicPartition  # defined there, once
from onceflow.stages.lineage import Position, Route

#: Default of ``onceflow.state.max-bytes``: the most bytes one aggregate value (one
#: window's, for a windowed aggregate) may take encoded (``guards.check_state``).
MAX_STATE_BYTES = 1_048_576


class AggregateState:
    """The folded value of one key plus, per route (root partition and path), the highest
    position folded."""

    __slots__ = ("home", "size", "value", "watermarks")

    def __init__(self, value: Any, watermarks: dict[Route, Position] | None = None,
                 home: TopicPartition | None = None, size: int = 0):
        self.value = value
        self.watermarks: dict[Route, Position] = watermarks or {}
        self.home = home
        self.size = size  # bytes of its encoding as last loaded or written (cache metrics)

    def __repr__(self) -> str:
        return f"AggregateState({self.value!r}, {self.watermarks!r}, home={self.home!r})"


def compact_json(value: Any) -> bytes:
    """``json.dumps(value, separators=(",", ":")).encode()``, as ``json.loads`` reads it
    back, at orjson's speed (3-5x) when ``value`` is plain JSON (``plain_json``); anything
    else gets the json module's bytes, or its error."""
    if plain_json(value, 0):
        try:
            encoded = orjson.dumps(value)
        except TypeError:  # an integer beyond 64 bits, a str with a lone surrogate
            pass
        else:
            # A copy, so orjson's buffer is freed whole: it starts every output in 1 KiB
            # from malloc and shrinks it in place, and the rows a snapshot keeps until
            # they are written would each pin a 1 KiB hole, growing the heap.
            return bytes(memoryview(encoded))
    return json.dumps(value, separators=(",", ":")).encode()


def plain_json(value: object, depth: int) -> bool:
    """True if orjson writes ``value`` as the json module does, or refuses it: dicts with
    str keys, lists and tuples, str, int, bool, None and finite floats, each of exactly
    that type, nested no deeper than orjson writes. Not: NaN and infinities (orjson
    writes null), subclasses (an IntEnum, a Counter: json's own rules apply), and what
    json refuses but orjson writes (UUID, datetime, dataclass)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True  # orjson refuses what it cannot write as json does: see compact_json
    if kind is float:
        return math.isfinite(cast(float, value))
    if depth >= 250:  # orjson refuses deeper nesting
        return False
    if kind is dict:
        for key, item in cast(dict[object, object], value).items():
            if type(key) is not str or not plain_json(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        # a list or a tuple (a cast is checked at run time: ``onceflow.compiled``)
        return all(plain_json(item, depth + 1) for item in cast(Sequence[object], value))
    return False


def encode_state(state: AggregateState) -> bytes:
    marks = [[topic, partition, list(pos)] for (topic, partition), pos in state.watermarks.items()]
    doc: dict[str, Any] = {"v": state.value, "w": marks}
    if state.home is not None:
        doc["h"] = list(state.home)
    return compact_json(doc)


def decode_state(data: bytes) -> AggregateState:
    """The state ``encode_state`` wrote; ValueError for anything else (garbage in the store
    row), whose watermarks or home would fail far from here, on a record."""
    try:
        doc = json.loads(data)
        marks = {_partition(topic, partition): _position(pos) for topic, partition, pos
                 in doc["w"]}
        home = doc.get("h")
        return AggregateState(doc["v"], marks, None if home is None else _partition(*home),
                              len(data))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as error:
        raise ValueError(f"not a onceflow state: {type(error).__name__}: {error}") from error


def _partition(topic: object, partition: object) -> TopicPartition:
    if type(topic) is not str or type(partition) is not int:
        raise TypeError(f"partition {topic!r}/{partition!r} is not a topic and a number")
    return topic, partition


def _position(pos: object) -> Position:
    if type(pos) is not list or not pos or any(type(p) is not int for p in pos):
        raise TypeError(f"position {pos!r} is not a list of offsets")
    return tuple(pos)
