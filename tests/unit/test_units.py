"""Units (``republish(..., unit=True)``) on the pure runner: a unit's items are read as
the separate records they replace, at the same positions, on every hop.

Each property feeds the same input through a per-value and a unit republisher
and compares what readers downstream make of the two: the records each item
stands for, the positions and chains of a further hop, and a windowed
aggregate's states, late events and counters under replays.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runner import Rec, Store

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages import Pipeline, Tumbling, republish
from onceflow.stages.lineage import root_of
from onceflow.stages.outcome import Output
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.units import item_at, item_view

Out = dict[str, Any]  # {"k": key, "t": event time, "v": value, "drop": bool, "n": copies}


def hop1(unit: bool) -> Pipeline:
    """Raw JSON reports {"outs": [...]} -> each out not dropped, republished by its key."""
    return (Pipeline("hop1", topics=("raw",), format="json")
            .flat_map("fan", lambda report: report["outs"])
            .filter("keep", lambda out: not out["drop"])
            .republish("out", "norm", key=lambda out: out["k"],
                       event_time_ms=lambda out: out["t"], unit=unit))


def hop2(unit: bool) -> Pipeline:
    """The normalized values, each ``n`` times (a user decoder: item envelopes)."""
    return (Pipeline("hop2", topics=("norm",), decode=lambda e: json.loads(e.payload))
            .flat_map("again", lambda out: [out] * out["n"])
            .republish("out2", "norm2", unit=unit))


def hop3() -> Pipeline:
    """Per value, the default decoder (payload bytes: no item envelopes)."""
    return Pipeline("hop3", topics=("norm2",)).republish("out3", "final", encode=bytes)


def run(pipeline: Pipeline, records: Sequence[Rec]) -> list[Output]:
    runner = PipelineRunner(pipeline, Store().load, "dlq")
    outcome = runner.process(records)
    assert outcome.dead_letters == 0
    return outcome.outputs


def consumed(topic: str, outputs: Sequence[Output]) -> list[Rec]:
    """Outputs as one partition of ``topic`` reads them back."""
    return [Rec(topic, 0, offset, out.value, out.key, out.headers)
            for offset, out in enumerate(outputs)]


def reports(batches: list[list[Out]]) -> list[Rec]:
    return [Rec("raw", 0, 10 + n, json.dumps({"outs": outs}).encode(), b"r")
            for n, outs in enumerate(batches)]


def seen(outputs: Sequence[Output]) -> list[tuple[Any, ...]]:
    """What a reader can tell of each output record, intermediate offsets aside (a unit
    sits at another offset of its topic than the records it replaces: positions leave
    those offsets out on purpose)."""
    found = []
    for out in outputs:
        env = Envelope.FromString(out.value)
        root, position = root_of(env, "?", 0, 0)
        chain = [(ref.topic, ref.partition, ref.index) for ref in env.source_chain]
        found.append((out.key, env.event_id, root, position, chain, env.payload,
                      env.event_time_ms, env.payload_type, len(env.items)))
    return found


outs = st.fixed_dictionaries({
    "k": st.sampled_from("abc"), "t": st.integers(0, 5_000), "v": st.integers(1, 9),
    "drop": st.booleans(), "n": st.integers(0, 3)})
streams = st.lists(st.lists(outs, max_size=6), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(streams)
def test_each_item_reads_as_the_record_it_replaces(batches: list[list[Out]]) -> None:
    per_value = run(hop1(False), reports(batches))
    units = run(hop1(True), reports(batches))
    views = [item_view(env, item).SerializeToString()
             for env in (Envelope.FromString(out.value) for out in units) for item in env.items]
    assert views == [out.value for out in per_value]
    assert len(units) <= len(per_value)
    # One record per run of consecutive outputs of one input with one key:
    slots = [(Envelope.FromString(out.value).source_chain[0].offset, out.key)
             for out in per_value]
    assert len(units) == sum(1 for n, slot in enumerate(slots) if n == 0 or slots[n - 1] != slot)


@settings(max_examples=150, deadline=None)
@given(streams, st.booleans())
def test_three_hops_see_the_same_positions_and_chains(batches: list[list[Out]],
                                                      units_at_hop2: bool) -> None:
    """Units at hop 1; per value or units at hop 2; hop 3 per value sees the same events."""
    def final(unit1: bool, unit2: bool) -> list[tuple[Any, ...]]:
        norm = run(hop1(unit1), reports(batches))
        norm2 = run(hop2(unit2), consumed("norm", norm))
        return seen(run(hop3(), consumed("norm2", norm2)))

    want = final(False, False)
    assert final(True, units_at_hop2) == want
    assert all(len(entry[3]) == 4 for entry in want)  # root offset, three hop indexes


def windows() -> Pipeline:
    return (Pipeline("agg", topics=("norm",), decode=lambda e: json.loads(e.payload))
            .aggregate("w", key=lambda out: out["k"], init=lambda: 0,
                       fold=lambda total, out: total + out["v"],
                       window=Tumbling(1_000, event_time_ms=lambda out: out["t"])))


def aggregated(records: list[Rec], upto: int, again_from: int) -> tuple[Any, ...]:
    """Fold ``records[:upto]``, persist, then (a restart) fold ``records[again_from:]`` in a
    new runner: what the aggregate ends with, what it wrote late, what it counted."""
    store = Store()
    first = PipelineRunner(windows(), store.load, "dlq")
    a = first.process(records[:upto])
    store.persist(first)
    again = PipelineRunner(windows(), store.load, "dlq")
    b = again.process(records[again_from:])
    late = sorted((dict(o.headers)["onceflow.root"], dict(o.headers)["onceflow.position"])
                  for o in [*a.outputs, *b.outputs])
    states = {key: (state.value, dict(state.watermarks))
              for key, state in again.tables[0].states.items()}
    return (states, sorted(again.tables[0].closed.items()), late, a.folded + b.folded,
            a.duplicates + b.duplicates, a.late + b.late, a.dead_letters + b.dead_letters)


@settings(max_examples=150, deadline=None)
@given(streams, st.integers(0, 40), st.integers(0, 40))
def test_a_windowed_aggregate_folds_units_as_separate_records(
        batches: list[list[Out]], cut: int, back: int) -> None:
    """Same states, watermarks, closed windows, late events and counts, with a restart that
    replays from an earlier record (at a unit's boundary, where both streams can cut)."""
    per_value = consumed("norm", run(hop1(False), reports(batches)))
    units = consumed("norm", run(hop1(True), reports(batches)))
    sizes = [len(Envelope.FromString(r.value or b"").items) for r in units]
    upto = cut % (len(units) + 1)
    again_from = max(0, upto - back)
    want = aggregated(per_value, sum(sizes[:upto]), sum(sizes[:again_from]))
    assert aggregated(units, upto, again_from) == want
    assert not want[-1]


def test_a_long_run_is_cut_into_several_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit stays far below the producer's request size: a long run is cut in order."""
    monkeypatch.setattr(republish, "UNIT_MAX_BYTES", 120)
    batches = [[{"k": "a", "t": n, "v": n, "drop": False, "n": 1} for n in range(7)]]
    per_value = run(hop1(False), reports(batches))
    units = [Envelope.FromString(out.value) for out in run(hop1(True), reports(batches))]
    assert [len(unit.items) for unit in units] == [3, 3, 1]  # 40-byte payloads
    assert [item_view(unit, item).SerializeToString() for unit in units
            for item in unit.items] == [out.value for out in per_value]


def test_with_meta_gets_each_items_envelope() -> None:
    batches = [[{"k": "a", "t": 5, "v": 1, "drop": False, "n": 1},
                {"k": "a", "t": 6, "v": 2, "drop": False, "n": 1}]]
    (unit,) = consumed("norm", run(hop1(True), reports(batches)))
    metas = (Pipeline("m", topics=("norm",), with_meta=True)
             .map("meta", lambda pair: pair[1].envelope)
             .republish("r", "out", encode=lambda e: e.SerializeToString()))
    outputs = run(metas, [unit])
    separate = run(hop1(False), reports(batches))
    assert [Envelope.FromString(Envelope.FromString(o.value).payload).SerializeToString()
            for o in outputs] == [o.value for o in separate]


def test_a_unit_whose_item_does_not_decode_is_one_dead_letter() -> None:
    (unit,) = run(hop1(True), reports([[{"k": "a", "t": 1, "v": 1, "drop": False, "n": 1},
                                        {"k": "a", "t": 2, "v": 2, "drop": False, "n": 1}]]))
    env = Envelope.FromString(unit.value)
    env.items[1].payload = b"not json"
    store = Store()
    runner = PipelineRunner(windows(), store.load, "dlq")
    outcome = runner.process([Rec("norm", 0, 0, env.SerializeToString(), b"a")])
    assert outcome.dead_letters == 1 and not outcome.folded
    assert outcome.outputs[0].value == env.SerializeToString()  # the whole record
    assert "'decode'" in dict(outcome.outputs[0].headers)["onceflow.reason"].decode()


@pytest.mark.parametrize(("change", "reason"), [
    (lambda env: env.items[1].__setattr__("index", 0), "fan-out order"),
    (lambda env: env.ClearField("source_chain"), "without a source chain"),
])
def test_a_unit_no_republisher_writes_is_dead_lettered(change: Any, reason: str) -> None:
    (unit,) = run(hop1(True), reports([[{"k": "a", "t": 1, "v": 1, "drop": False, "n": 1},
                                        {"k": "a", "t": 2, "v": 2, "drop": False, "n": 1}]]))
    env = Envelope.FromString(unit.value)
    change(env)
    runner = PipelineRunner(windows(), Store().load, "dlq")
    outcome = runner.process([Rec("norm", 0, 5, env.SerializeToString(), b"a")])
    assert outcome.dead_letters == 1 and not outcome.folded
    assert reason in dict(outcome.outputs[0].headers)["onceflow.reason"].decode()


def test_a_late_event_names_its_item_by_position() -> None:
    (unit,) = run(hop1(True), reports([[{"k": "a", "t": 9, "v": 1, "drop": False, "n": 1},
                                        {"k": "a", "t": 7, "v": 2, "drop": True, "n": 1},
                                        {"k": "a", "t": 8, "v": 3, "drop": False, "n": 1}]]))
    env = Envelope.FromString(unit.value)
    assert [item.index for item in env.items] == [0, 1]
    second = item_at(env, (10, 1))
    assert json.loads(second.payload)["v"] == 3 and second.event_time_ms == 8
    assert second.source_chain[-1].index == 1 and second.event_id == "raw/0/10.2"
    plain = Envelope(payload=b"x")
    assert item_at(plain, (3,)) is plain


def test_what_units_refuse_at_build_time() -> None:
    base = Pipeline("p", topics=("in",))
    with pytest.raises(ValueError, match="format 'json' holds one value"):
        base.republish("r", "out", unit=True, format="json")
    with pytest.raises(ValueError, match="exclusive=True is not supported"):
        base.republish("r", "out", unit=True, exclusive=True)
    counted = base.aggregate("c", key=str, init=lambda: 0, fold=lambda s, _: s + 1)
    with pytest.raises(ValueError, match="after an aggregate is not supported"):
        counted.republish("r", "out", unit=True)
    counted.repartition("hop", key=str).republish("r", "out", unit=True)  # another segment
    counted.republish("r", "out")  # per value: fine


class Millis:
    """An integer type that is not ``int`` (as numpy's are): protobuf takes it by ``__index__``."""

    def __init__(self, value: int):
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize("unit", [True, False])
def test_republish_takes_what_protobuf_takes_from_user_functions(unit: bool) -> None:
    """The republish step is compiled, and compiled code checks hints at run time: what
    the user's event time, key and encode functions return goes to protobuf as it is,
    so an event time of an integer type other than ``int`` is republished, compiled or
    not (read through the step's ``int`` hint, it raised TypeError compiled)."""
    pipeline = (Pipeline("odd", topics=("raw",), format="json")
                .flat_map("fan", lambda report: report["outs"])
                .republish("out", "norm", key=lambda out: out["k"],
                           event_time_ms=lambda out: Millis(out["t"]), unit=unit))
    outs = [{"k": "a", "t": 5}, {"k": "a", "t": 7}]
    outputs = run(pipeline, [Rec("raw", 0, 0, json.dumps({"outs": outs}).encode())])
    envelopes = [Envelope.FromString(out.value or b"") for out in outputs]
    if unit:
        assert [(i.event_time_ms, json.loads(i.payload)) for i in envelopes[0].items] == [
            (5, outs[0]), (7, outs[1])]
    else:
        assert [(e.event_time_ms, json.loads(e.payload)) for e in envelopes] == [
            (5, outs[0]), (7, outs[1])]
