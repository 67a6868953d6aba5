"""A poisoned record never loops: a fold or init whose value no store can hold, or that
raises, dead-letters its record (stage and key in the reason) and leaves the states as
before it, on every fold path; a stored row that is no state stops the worker.

The snapshot that encodes a state knows no record: a value it cannot encode used to
fail the pipeline actor, again on each replay, for ever (issue 29, reproduction 2).
"""

from __future__ import annotations

import math
from decimal import Decimal
from operator import itemgetter
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from onceflow.runtime.worker import _permanent
from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.guards import UnstorableState, _fits, check_state
from onceflow.stages.outcome import StageFailure
from onceflow.stages.state import (
    MAX_STATE_BYTES,
    AggregateState,
    compact_json,
    decode_state,
    encode_state,
)
from onceflow.stores.base import UndecodableState
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore
from onceflow.testing import Record, TestRun

DECIMAL = ("UnstorableState: the state is not JSON-serialisable (TypeError: Object of type "
           "Decimal is not JSON serializable)")

# --- the rule against the encoder -------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.integers(0, 4400).map(lambda digits: 10**digits)  # json refuses > 4300 digits
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
           | st.sampled_from(["\ud800", "é" * 40, "\x00\x1f\"", "\U00010000"])  # escaped: 6, 12 B
           | st.decimals(allow_nan=False) | st.sets(st.integers(), max_size=2)
           | st.builds(object))
values = st.recursive(scalars, lambda inner: (
    st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5) | st.integers(-3, 3) | st.sampled_from(["\ud800"]),
                      inner, max_size=4)), max_leaves=20)


def encoded_size(value: Any) -> int | None:
    """The stores' encoding's length, or None when the encoder refuses the value."""
    try:
        return len(compact_json(value))
    except Exception:
        return None


@settings(max_examples=600, deadline=None)
@given(values, st.integers(0, 600))
# A character beyond U+FFFF is 12 bytes where the json module writes (a lone surrogate
# elsewhere in the value): the walk once bounded every character at 6.
@example(value=("\x1f\U00010000", "\ud800"), limit=26)
def test_the_rule_is_the_encoders_and_the_walk_never_lets_more_through(value: Any,
                                                                       limit: int) -> None:
    size = encoded_size(value)
    if _fits(value, limit, 0) >= 0:  # the fast walk's yes needs no encode: it must be right
        assert size is not None and size <= limit
    if size is not None and size <= limit:
        check_state("sum", "k", value, limit)
        return
    with pytest.raises(StageFailure) as refused:
        check_state("sum", "k", value, limit)
    assert refused.value.stage_id == "sum" and refused.value.key == "k"
    assert isinstance(refused.value.error, UnstorableState)
    assert str(refused.value).startswith("stage 'sum', key 'k': UnstorableState: the state ")


def test_the_walk_bounds_the_common_states_without_encoding() -> None:
    for value in (0, -(10**18) + 1, 10**18 - 1, 1.5, math.nan, math.inf, True, None, "text",
                  {"ok": 3, "failed": 1}, {"open": {"60000": 4}, "max_ts": 120_000}, [1, [2]]):
        assert _fits(value, MAX_STATE_BYTES, 0) >= 0, value


def test_what_json_refuses_or_cannot_bound_is_refused() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    for value, why in ((Decimal("1.5"), "Decimal is not JSON serializable"),
                       ({1, 2}, "set is not JSON serializable"),
                       (object(), "object is not JSON serializable"),
                       ({(1, 2): 3}, "keys must be str"),
                       (cycle, "Circular reference"),
                       (10**5000, "Exceeds the limit"),
                       ("x" * MAX_STATE_BYTES, f"more than onceflow.state.max-bytes "
                                                f"({MAX_STATE_BYTES})")):
        with pytest.raises(StageFailure, match="UnstorableState") as refused:
            check_state("sum", "k", value, MAX_STATE_BYTES)
        assert why in str(refused.value)


# --- every fold path --------------------------------------------------------------------

def poisoning_fold(total: Any, item: list[Any]) -> Any:
    """Sums; an item of 0 makes a Decimal (what a payments pipeline might well do)."""
    return Decimal(total) if item[1] == 0 else total + item[1]


def shaped(shape: str) -> Pipeline:
    """Items [key, x, event time] of a record's "items", summed per key: ``plain`` and
    ``windowed`` run fused (single_fold, window_fold), ``*-general`` on the general path
    (a republish step after the aggregate)."""
    pipeline = Pipeline("p", topics=("in",), format="json").flat_map(
        "explode", itemgetter("items"))
    window = Tumbling(60_000, event_time_ms=itemgetter(2)) if "windowed" in shape else None
    pipeline = pipeline.aggregate("sum", key=itemgetter(0), init=int, fold=poisoning_fold,
                                  window=window)
    return pipeline.republish("out", "out") if shape.endswith("general") else pipeline


def totals(run: TestRun, shape: str) -> dict[str, Any]:
    states = run.states("sum")
    if "windowed" in shape:
        return {key: state["open"]["0"] for key, state in states.items() if state["open"]}
    return states


@pytest.mark.parametrize("shape", ["plain", "plain-general", "windowed", "windowed-general"])
def test_an_unstorable_state_dead_letters_its_record_and_keeps_the_states(shape: str) -> None:
    run = TestRun(shaped(shape), batch_size=2)
    runner = getattr(run.runner, "inner", run.runner)  # a single worker's: in the merge log's
    assert bool(runner._fused) is not shape.endswith("general")
    run.feed([
        Record({"items": [["a", 1, 10], ["a", 2, 20]]}),
        Record({"items": [["b", 0, 30]]}),  # b's first state: loaded, then poisoned
        Record({"items": [["a", 3, 40], ["a", 0, 50]]}),  # a unit: its 3 is not folded
        Record({"items": [["b", 4, 60], ["c", 5, 70]]}),
        Record({"items": [["c", 6, 80], ["b", 0, 90]]}),  # two keys: c's 6 not folded
        Record({"items": [["a", 4, 100]]}),
    ])
    assert [(d.record.offset, d.reason) for d in run.dead_letters] == [
        (1, f"stage 'sum', key 'b': {DECIMAL}"), (2, f"stage 'sum', key 'a': {DECIMAL}"),
        (4, f"stage 'sum', key 'b': {DECIMAL}")]
    assert totals(run, shape) == {"a": 7, "b": 4, "c": 5}
    run.commit()  # the snapshot encodes every state: none is refused there
    run.crash()
    assert totals(run, shape) == {"a": 7, "b": 4, "c": 5}
    assert run.counters["dead_letters"] == 3 and run.counters["sum.folded"] == 5


@pytest.mark.parametrize("shape", ["plain", "plain-general", "windowed", "windowed-general"])
def test_a_state_over_the_bound_dead_letters_its_record(shape: str) -> None:
    def grow(text: str, item: list[Any]) -> str:
        return text + "x" * item[1]

    pipeline = Pipeline("p", topics=("in",), format="json").flat_map("explode",
                                                                     itemgetter("items"))
    window = Tumbling(60_000, event_time_ms=itemgetter(2)) if "windowed" in shape else None
    pipeline = pipeline.aggregate("text", key=itemgetter(0), init=str, fold=grow, window=window)
    if shape.endswith("general"):
        pipeline = pipeline.republish("out", "out")
    run = TestRun(pipeline)
    big = MAX_STATE_BYTES // 2
    run.feed([Record({"items": [["a", big, 1]]}), Record({"items": [["a", big, 2]]}),
              Record({"items": [["a", 5, 3]]})])
    (dead,) = run.dead_letters
    assert dead.record.offset == 1 and dead.reason == (
        f"stage 'text', key 'a': UnstorableState: the state encodes to {2 * big + 2} bytes, "
        f"more than onceflow.state.max-bytes ({MAX_STATE_BYTES})")
    state = run.states("text")["a"]
    assert len(state["open"]["0"] if "windowed" in shape else state) == big + 5


@pytest.mark.parametrize("shape", ["plain", "plain-general"])
def test_an_init_that_raises_dead_letters_the_records_of_its_key(shape: str) -> None:
    def init() -> int:
        raise RuntimeError("no starting value")

    pipeline = (Pipeline("p", topics=("in",), format="json")
                .aggregate("sum", key=itemgetter("k"), init=init, fold=lambda s, v: s + 1))
    if shape.endswith("general"):
        pipeline = pipeline.republish("out", "out")
    run = TestRun(pipeline)
    run.feed([Record({"k": "a"}), Record({"k": "a"})])
    assert [d.reason for d in run.dead_letters] == [
        "stage 'sum', key 'a': RuntimeError: no starting value"] * 2
    assert run.states("sum") == {}
    run.commit()


# --- a stored row that is no state ------------------------------------------------------

@pytest.mark.parametrize("row", [
    b"garbage", b"\xff\xfe", b"[]", b"5", b'{"v": 1}', b'{"w": []}', b'{"v":1,"w":5}',
    b'{"v":1,"w":[["t",0]]}', b'{"v":1,"w":[["t","0",[1]]]}', b'{"v":1,"w":[["t",0,"12"]]}',
    b'{"v":1,"w":[["t",0,[]]]}', b'{"v":1,"w":[["t",0,[1.5]]]}', b'{"v":1,"w":[],"h":[1]}',
    b'{"v":1,"w":[],"h":"t|0"}', b"[" * 100_000,
])
def test_a_row_that_is_no_state_is_refused_at_decode(row: bytes) -> None:
    with pytest.raises(ValueError, match="not a onceflow state"):
        decode_state(row)


def test_a_state_decodes_as_written() -> None:
    state = AggregateState({"ok": 1}, {("t", 0): (5, 1), ("u", 3): (7,)}, ("t", 0))
    back = decode_state(encode_state(state))
    assert (back.value, back.watermarks, back.home) == (state.value, state.watermarks,
                                                       state.home)


def test_an_undecodable_state_names_its_row_and_stops_the_worker() -> None:
    redis = RedisStore("redis://127.0.0.1:1", "onceflow", "pay")  # no I/O until used
    cassandra = CassandraStore(["127.0.0.1"], "pay", keyspace="ks")
    assert redis.row_name("sum", "k1") == "redis key 'onceflow:pay:s:sum:k1'"
    assert cassandra.row_name("sum", "k1") == (
        "cassandra table \"ks\".states row (pipeline, stage, key) = ('pay', 'sum', 'k1')")
    error = UndecodableState("sum", "k1", redis.row_name("sum", "k1"), ValueError("bad"))
    assert str(error) == ("the stored state of stage 'sum', key 'k1' cannot be decoded (bad); "
                          "its row: redis key 'onceflow:pay:s:sum:k1'; repair or delete that "
                          "row, then start the worker again")
    assert _permanent(error)  # the supervisor escalates at once: no restart loop
    redis.close()
