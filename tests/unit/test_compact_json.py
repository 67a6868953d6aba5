"""``state.compact_json``, the encoding of state and history rows: what ``json.dumps``
writes, as ``json.loads`` reads it back, or the json module's error."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections import Counter, OrderedDict
from datetime import UTC, datetime
from enum import Enum, IntEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.stages.state import compact_json

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text())
values = st.recursive(scalars, lambda inner: (
    st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5) | st.integers(-3, 3), inner, max_size=4)), max_leaves=20)


def same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN (json writes it, and reads it back, as NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=400)
@given(values)
def test_reads_back_as_the_json_modules_bytes_do(value: Any) -> None:
    expected = json.loads(json.dumps(value, separators=(",", ":")))
    assert same(json.loads(compact_json(value)), expected)


class Colour(Enum):
    RED = 1


class Level(IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize("value", [uuid.uuid4(), datetime.now(UTC), Colour.RED, Point(1),
                                   {(1, 2): "a key json cannot write"}, b"bytes", {"a set"}])
def test_what_the_json_module_refuses_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        json.dumps(value)
    with pytest.raises(TypeError):
        compact_json(value)


def test_the_common_shapes_take_orjsons_bytes() -> None:
    assert compact_json({"ok": 3, "failed": 0}) == b'{"ok":3,"failed":0}'
    assert compact_json({"open": {"60000": {"ok": 1}}, "max_ts": None}) == \
        b'{"open":{"60000":{"ok":1}},"max_ts":null}'
    assert json.loads(compact_json(Level.HIGH)) == 3  # an int, as json.dumps writes it


class Name(str):
    pass


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [
    Counter({"a": 2}), OrderedDict(b=1), Level.HIGH, Name("n"), {"v": [True, None, 1.5]},
    math.nan, [math.inf, -math.inf], 2**64 - 1, 2**64, -(2**63), -(2**63) - 1,
    "\ud800 a lone surrogate", {3: "an int key"}, (1, (2, "t")), nested(300)])
def test_edges_read_back_as_the_json_modules_bytes_do(value: Any) -> None:
    expected = json.loads(json.dumps(value, separators=(",", ":")))
    assert same(json.loads(compact_json(value)), expected)
