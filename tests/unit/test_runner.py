"""The fold and watermark rules of DESIGN.md, on the pure runner (no I/O)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.stages import Aggregate, Pipeline
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, decode_state, encode_state


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes | None


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
            for key, state in table.take_dirty().items():
                self.rows[key] = encode_state(state)


def make(store: Store | None = None) -> tuple[PipelineRunner, Store]:
    store = store or Store()
    return PipelineRunner(sum_pipeline(), store.load, "dlq"), store


def totals(runner: PipelineRunner) -> dict[str, Any]:
    return {k: s.value for k, s in runner.tables[0].states.items()}


def test_duplicate_record_is_discarded_and_counted() -> None:
    runner, _ = make()
    rec = Rec("in", 0, 7, envelope({"k": "a", "xs": [1, 2]}))
    first = runner.process([rec])
    again = runner.process([rec])
    assert totals(runner) == {"a": 3}
    assert first.folded["sum"] == 2 and first.duplicates["sum"] == 0
    assert again.duplicates["sum"] == 2 and again.folded["sum"] == 0


def test_replay_after_restart_skips_persisted_offsets_only() -> None:
    records = [Rec("in", 0, o, envelope({"k": "a", "xs": [o]})) for o in range(10)]
    runner, store = make()
    runner.process(records[:6])
    store.persist(runner)  # offsets 0..5 durable
    runner.process(records[6:8])  # folded in memory, then the process dies
    restarted, _ = make(store)
    outcome = restarted.process(records[3:])  # committed offset was 3: replay from there
    assert outcome.duplicates["sum"] == 3  # 3, 4, 5 were already in the persisted state
    assert totals(restarted) == {"a": sum(range(10))}


def test_several_root_partitions_feed_one_key_independently() -> None:
    runner, _ = make()
    # Offset 5 of partition 1 arrives after offset 9 of partition 0: not a duplicate.
    runner.process([Rec("in", 0, 9, envelope({"k": "a", "xs": [1]}))])
    runner.process([Rec("in", 1, 5, envelope({"k": "a", "xs": [10]}))])
    replay = runner.process(
        [Rec("in", 0, 9, envelope({"k": "a", "xs": [1]})),
         Rec("in", 1, 5, envelope({"k": "a", "xs": [10]}))]
    )
    assert totals(runner) == {"a": 11}
    assert replay.duplicates["sum"] == 2
    marks = runner.tables[0].states["a"].watermarks
    assert marks == {("in", 0): (9, 0), ("in", 1): (5, 0)}


def test_root_comes_from_the_source_chain_not_the_consumed_offset() -> None:
    runner, _ = make()
    chain = [("raw", 2, 40, 1)]
    # The same event republished twice lands at two offsets of the middle topic.
    runner.process([Rec("mid", 0, 100, envelope({"k": "a", "xs": [5]}, chain))])
    dup = runner.process([Rec("mid", 0, 101, envelope({"k": "a", "xs": [5]}, chain))])
    assert totals(runner) == {"a": 5}
    assert dup.duplicates["sum"] == 1
    assert runner.tables[0].states["a"].watermarks == {("raw", 2): (40, 1, 0)}


def test_fan_out_index_orders_outputs_of_one_root_offset() -> None:
    runner, _ = make()
    # Outputs 0 and 1 of raw offset 40 travel separately; both count, once each.
    out0 = Rec("mid", 0, 1, envelope({"k": "a", "xs": [1]}, [("raw", 0, 40, 0)]))
    out1 = Rec("mid", 0, 2, envelope({"k": "a", "xs": [2]}, [("raw", 0, 40, 1)]))
    runner.process([out0, out1])
    replay = runner.process([out0, out1])
    assert totals(runner) == {"a": 3}
    assert replay.duplicates["sum"] == 2
    # Index 0 after index 1 has been folded is a replay, so it is discarded.
    assert runner.process([out0]).duplicates["sum"] == 1


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
    runner = PipelineRunner(pipeline, lambda spec, keys: {}, "dlq")
    good = Rec("in", 0, 0, envelope({"xs": [["a", 1], ["b", 2]]}))
    bad = Rec("in", 0, 1, envelope({"xs": [["a", 10], ["b", 20], ["a", -1]]}))
    runner.process([good])
    outcome = runner.process([bad])
    # Neither a's +10 nor b's +20 was kept, and the watermark did not move.
    assert {k: s.value for k, s in runner.tables[0].states.items()} == {"a": 1, "b": 2}
    assert runner.tables[0].states["a"].watermarks == {("in", 0): (0, 0)}
    assert outcome.dead_letters == 1
    (dead,) = outcome.outputs
    assert dead.topic == "dlq" and dead.value == bad.value
    assert dict(dead.headers)["onceflow.reason"].startswith(b"stage 'sum': ValueError: negative")
    assert outcome.next_offsets == {("in", 0): 2}  # the dead-lettered record is still covered


def test_undecodable_record_goes_to_dead_letters_with_reason() -> None:
    runner, _ = make()
    outcome = runner.process([Rec("in", 3, 8, b"\xff\xff not protobuf")])
    (dead,) = outcome.outputs
    headers = dict(dead.headers)
    assert headers["onceflow.reason"].startswith(b"undecodable envelope")
    assert headers["onceflow.source"] == b"in/3/8"
    assert outcome.next_offsets == {("in", 3): 9}


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
    runner = PipelineRunner(pipeline, lambda spec, keys: {}, "dlq")
    outcome = runner.process([Rec("raw", 2, 40, envelope({"xs": [7, 8]}, [("src", 0, 3, 1)]))])
    envelopes = [Envelope.FromString(o.value) for o in outcome.outputs]
    chains = [[(r.topic, r.partition, r.offset, r.index) for r in e.source_chain]
              for e in envelopes]
    assert chains == [
        [("src", 0, 3, 1), ("raw", 2, 40, 0)],
        [("src", 0, 3, 1), ("raw", 2, 40, 1)],
    ]
    assert [o.key for o in outcome.outputs] == [b"7", b"8"]


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
    store = Store()
    runner = PipelineRunner(two_stage_pipeline(), store.load, "dlq")
    rec = Rec("in", 0, 4, envelope({"k": "a", "xs": [1, 2]}))
    runner.process([rec])
    outcome = runner.process([rec])
    assert outcome.duplicates == {"sum": 2}  # stopped at the first stage
    assert outcome.folded == {}
    assert [t.states[k].value for t in runner.tables for k in t.states] == [3, 3]


def test_persisting_upstream_first_then_crashing_loses_downstream_events() -> None:
    """Why DESIGN.md invariant 6 exists, on the pure runner."""
    records = [Rec("in", 0, o, envelope({"k": "a", "xs": [1]})) for o in range(5)]

    def crash_after_persisting(order: list[int]) -> int:
        store = Store()
        runner = PipelineRunner(two_stage_pipeline(), store.load, "dlq")
        runner.process(records)
        dirty = [t.take_dirty() for t in runner.tables]
        first = order[0]  # only one stage's states reach the store, then the crash
        for key, state in dirty[first].items():
            store.rows[f"{first}:{key}"] = encode_state(state)
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
