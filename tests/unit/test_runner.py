"""The fold and watermark rules on the pure runner (no I/O).

Most tests run through ``onceflow.testing``; those about the runner's own
mechanics (batched loads, persistence order) drive ``PipelineRunner`` with
the small ``Rec``/``Store`` fakes below, which other unit tests import too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from onceflow import testing
from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.stages import Aggregate, Pipeline
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, decode_state, encode_state
from onceflow.testing import Record, TestRun


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None


def envelope(payload: Any, chain: Sequence[tuple[str, int, int, int]] = ()) -> bytes:
    env = Envelope(payload=json.dumps(payload).encode())
    for topic, partition, offset, index in chain:
        env.source_chain.append(
            SourceRef(topic=topic, partition=partition, offset=offset, index=index)
        )
    return env.SerializeToString()


def sum_pipeline() -> Pipeline:
    """Each record is {"k": key, "xs": [numbers]}; flat-map the numbers, sum per key."""
    return (
        Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: [(r["k"], x) for x in r["xs"]])
        .aggregate("sum", key=lambda kv: kv[0], init=lambda: 0, fold=lambda s, kv: s + kv[1])
    )


class Store:
    """A dict standing in for Redis: persisted encoded states per key."""

    def __init__(self) -> None:
        self.rows: dict[str, bytes] = {}
        self.loads = 0

    def load(self, spec: Aggregate, keys: Sequence[str]) -> Mapping[str, AggregateState]:
        self.loads += 1
        return {k: decode_state(self.rows[k]) for k in keys if k in self.rows}

    def persist(self, runner: PipelineRunner) -> None:
        for table in runner.tables:
            for key, data in table.take_dirty(0).items():
                self.rows[key] = data
            table.written(0)


def make(store: Store | None = None) -> tuple[PipelineRunner, Store]:
    store = store or Store()
    return PipelineRunner(sum_pipeline(), store.load, "dlq"), store


def test_duplicate_record_is_discarded_and_counted() -> None:
    run = TestRun(sum_pipeline())
    (rec,) = run.feed([Record({"k": "a", "xs": [1, 2]}, offset=7)])
    assert run.counters == {"records": 1, "sum.folded": 2}
    run.duplicate(rec)
    assert run.states("sum") == {"a": 3}
    assert run.counters == {"records": 2, "sum.folded": 2, "sum.duplicates": 2}


def test_replay_after_restart_skips_persisted_offsets_only() -> None:
    records = [Record({"k": "a", "xs": [o]}) for o in range(10)]
    run = TestRun(sum_pipeline())
    run.feed(records[:3])
    run.commit()  # committed offset 3
    run.feed(records[3:6])
    run.persist()  # offsets 3..5 durable, not committed
    run.feed(records[6:8])  # folded in memory, then the process dies
    run.crash()  # replays from the committed offset 3
    assert run.counters["sum.duplicates"] == 3  # 3, 4, 5 were already in the persisted state
    run.feed(records[8:])
    assert run.states("sum") == {"a": sum(range(10))}


def test_several_root_partitions_feed_one_key_independently() -> None:
    run = TestRun(sum_pipeline())
    # Offset 5 of partition 1 arrives after offset 9 of partition 0: not a duplicate.
    fed = run.feed([Record({"k": "a", "xs": [1]}, offset=9)])
    fed += run.feed([Record({"k": "a", "xs": [10]}, partition=1, offset=5)])
    run.duplicate(*fed)
    assert run.states("sum") == {"a": 11}
    assert run.counters["sum.duplicates"] == 2
    assert run.watermarks("sum", "a") == {("in", 0): (9, 0), ("in", 1): (5, 0)}


def test_root_comes_from_the_source_chain_not_the_consumed_offset() -> None:
    run = TestRun(sum_pipeline())
    republished = testing.envelope({"k": "a", "xs": [5]}, chain=[("raw", 2, 40, 1)])
    # The same event republished twice lands at two offsets of the middle topic.
    run.feed([Record(republished, topic="mid", offset=100), Record(republished, topic="mid")])
    assert run.states("sum") == {"a": 5}
    assert run.counters == {"records": 2, "sum.folded": 1, "sum.duplicates": 1}
    assert run.watermarks("sum", "a") == {("raw", 2): (40, 1, 0)}


def test_fan_out_index_orders_outputs_of_one_root_offset() -> None:
    run = TestRun(sum_pipeline())
    # Outputs 0 and 1 of raw offset 40 travel separately; both count, once each.
    out0, out1 = run.feed([
        Record(testing.envelope({"k": "a", "xs": [1]}, chain=[("raw", 0, 40, 0)]), "mid", 0, 1),
        Record(testing.envelope({"k": "a", "xs": [2]}, chain=[("raw", 0, 40, 1)]), "mid", 0, 2),
    ])
    run.duplicate(out0, out1)
    assert run.states("sum") == {"a": 3}
    assert run.counters["sum.duplicates"] == 2
    # Index 0 after index 1 has been folded is a replay, so it is discarded.
    run.duplicate(out0)
    assert run.counters["sum.duplicates"] == 3


def test_flat_mapped_unit_applies_whole_or_not_at_all() -> None:
    def fold(state: int, kv: tuple[str, int]) -> int:
        if kv[1] < 0:
            raise ValueError("negative")
        return state + kv[1]

    pipeline = (
        Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: [(k, x) for k, x in r["xs"]])
        .aggregate("sum", key=lambda kv: kv[0], init=lambda: 0, fold=fold)
    )
    run = TestRun(pipeline, dead_letter_topic="dlq")
    run.feed([Record({"xs": [["a", 1], ["b", 2]]})])
    (bad,) = run.feed([Record({"xs": [["a", 10], ["b", 20], ["a", -1]]})])
    # Neither a's +10 nor b's +20 was kept, and the watermark did not move.
    assert run.states("sum") == {"a": 1, "b": 2}
    assert run.watermarks("sum", "a") == {("in", 0): (0, 0)}
    assert run.counters["dead_letters"] == 1
    (dead,) = run.produced
    assert dead.topic == "dlq" and dead.value == bad.value
    assert dead.headers["onceflow.reason"].startswith("stage 'sum', key 'a': ValueError: negative")
    assert run.dead_letters == [testing.DeadLetter(bad, dead.headers["onceflow.reason"])]
    run.commit()
    assert run.committed == {("in", 0): 2}  # the dead-lettered record is still covered


def test_undecodable_record_goes_to_dead_letters_with_reason() -> None:
    run = TestRun(sum_pipeline())
    run.feed([Record(b"\xff\xff not protobuf", partition=3, offset=8)])
    (dead,) = run.produced
    assert dead.headers["onceflow.reason"].startswith("undecodable envelope")
    assert dead.headers["onceflow.source"] == "in/3/8"
    run.commit()
    assert run.committed == {("in", 3): 9}


def test_states_load_once_per_batch_for_missing_keys() -> None:
    runner, store = make()
    records = [Rec("in", 0, o, envelope({"k": f"k{o % 3}", "xs": [1]})) for o in range(30)]
    runner.process(records)
    assert store.loads == 1
    runner.process(records)
    assert store.loads == 1  # everything cached now


def pairs_pipeline() -> Pipeline:
    """Each record is {"xs": [[key, number], ...]}: one record may touch several keys."""
    return (
        Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: [tuple(kv) for kv in r["xs"]])
        .aggregate("sum", key=lambda kv: kv[0], init=lambda: 0, fold=lambda s, kv: s + kv[1])
    )


def test_records_after_a_state_load_keep_their_order() -> None:
    store = Store()
    runner = PipelineRunner(pairs_pipeline(), store.load, "dlq")
    runner.process([Rec("in", 0, 0, envelope({"xs": [["a", 1]]}))])  # "a" now cached
    # Offset 1 touches "a" and the unloaded "b"; offset 2 touches only the cached "a".
    # Applying offset 2 first would make offset 1 look like a replay for "a".
    outcome = runner.process([
        Rec("in", 0, 1, envelope({"xs": [["a", 10], ["b", 20]]})),
        Rec("in", 0, 2, envelope({"xs": [["a", 100]]})),
    ])
    assert outcome.duplicates["sum"] == 0
    assert {k: s.value for k, s in runner.tables[0].states.items()} == {"a": 111, "b": 20}
    assert store.loads == 2


def test_state_encoding_round_trips_value_and_watermarks() -> None:
    state = AggregateState({"ok": 3}, {("raw", 1): (40, 2, 0), ("raw", 0): (7,)})
    back = decode_state(encode_state(state))
    assert back.value == {"ok": 3}
    assert back.watermarks == state.watermarks


def test_republish_appends_source_ref_with_fan_out_index() -> None:
    pipeline = (
        Pipeline("r", topics=("raw",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: r["xs"])
        .republish("out", "mid", encode=lambda x: json.dumps(x).encode(), key=str)
    )
    run = TestRun(pipeline)
    run.feed([Record(testing.envelope({"xs": [7, 8]}, chain=[("src", 0, 3, 1)]), "raw", 2, 40)])
    chains = [[(r.topic, r.partition, r.offset, r.index) for r in o.envelope.source_chain]
              for o in run.produced]
    assert chains == [
        [("src", 0, 3, 1), ("raw", 2, 40, 0)],
        [("src", 0, 3, 1), ("raw", 2, 40, 1)],
    ]
    assert [o.key for o in run.produced] == [b"7", b"8"]


@pytest.mark.parametrize("bad_id", ["", "has space", "x" * 101])
def test_stage_ids_are_validated(bad_id: str) -> None:
    with pytest.raises(ValueError, match="id"):
        Pipeline("p", topics=("in",)).map(bad_id, str)


def test_duplicate_stage_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate stage id"):
        Pipeline("p", topics=("in",)).map("a", str).map("a", str)


def two_stage_pipeline() -> Pipeline:
    """Per-key sums, then a grand total fed by what the first stage folded."""
    return (
        sum_pipeline()
        .aggregate("total", key=lambda kv: "all", init=lambda: 0, fold=lambda s, kv: s + kv[1])
    )


def test_a_replay_discarded_upstream_never_reaches_downstream() -> None:
    run = TestRun(two_stage_pipeline())
    (rec,) = run.feed([Record({"k": "a", "xs": [1, 2]}, offset=4)])
    run.duplicate(rec)
    # The replay stopped at the first stage: "total" saw neither duplicates nor folds.
    assert run.counters == {"records": 2, "sum.folded": 2, "total.folded": 2,
                            "sum.duplicates": 2}
    assert run.states("sum") == {"a": 3} and run.states("total") == {"all": 3}


def test_persisting_upstream_first_then_crashing_loses_downstream_events() -> None:
    """Why states are persisted downstream first (docs/guide/guarantees.md, 6), on the runner."""
    records = [Rec("in", 0, o, envelope({"k": "a", "xs": [1]})) for o in range(5)]

    def crash_after_persisting(order: list[int]) -> int:
        store = Store()
        runner = PipelineRunner(two_stage_pipeline(), store.load, "dlq")
        runner.process(records)
        dirty = [t.take_dirty(1) for t in runner.tables]
        first = order[0]  # only one stage's states reach the store, then the crash
        for key, data in dirty[first].items():
            store.rows[f"{first}:{key}"] = data
        restarted = PipelineRunner(two_stage_pipeline(), _prefixed(store), "dlq")
        restarted.process(records)  # nothing was committed: replay everything
        return restarted.tables[1].states["all"].value

    assert crash_after_persisting(order=[1, 0]) == 5  # downstream first: exact
    assert crash_after_persisting(order=[0, 1]) == 0  # upstream first: all 5 lost


def _prefixed(store: Store) -> Any:
    names = {"sum": 0, "total": 1}

    def load(spec: Aggregate, keys: Sequence[str]) -> Mapping[str, AggregateState]:
        rows = {k: store.rows.get(f"{names[spec.id]}:{k}") for k in keys}
        return {k: decode_state(v) for k, v in rows.items() if v is not None}

    return load
