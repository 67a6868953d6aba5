"""What users build and keep stays a plain Python value, compiled or not.

The record path is compiled (``onceflow.compiled``), and a class mypyc compiles
cannot be copied or pickled as a dataclass can: ``copy.copy`` of one raised
``FrozenInstanceError``. So the values users declare or are handed
(``stages.declarations``, ``stages.record_meta``) live in modules left out of
the build; this suite runs compiled in CI and fails if one moves back in.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from onceflow import ProducerDedup
from onceflow.stages import Tumbling
from onceflow.stages.formats import RecordMeta


def event_time(value: dict[str, int]) -> int:  # a function: deepcopy keeps it, equal
    return value["ts"]


def serial(value: dict[str, str]) -> str:
    return value["serial"]


VALUES: list[Any] = [
    Tumbling(60_000, event_time_ms=event_time, allowed_lateness_ms=5_000),
    ProducerDedup(producer=serial, sequence="seq", store="redis"),
    RecordMeta("in", 1, 7, b"k", (("site", b"north"), ("gone", None)), 1_700),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_user_value_copies_pickles_and_stays_frozen(value: Any) -> None:
    assert copy.copy(value) == value
    assert copy.deepcopy(value) == value
    assert pickle.loads(pickle.dumps(value)) == value
    assert dataclasses.replace(value) == value
    field = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, None)
