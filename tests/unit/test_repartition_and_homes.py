"""Repartition segments and key homes on the pure runner (no I/O).

Two runners sharing one dict of homes and one dict of states stand for two
workers sharing a store: what the key-home check must catch is two workers
folding one key from two input partitions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest
from test_runner import Rec, Store, envelope

from onceflow import testing
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages import Aggregate, Pipeline
from onceflow.stages.outcome import Output
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import TopicPartition, decode_state, encode_state


class Homes:
    """Set-if-absent per key, like the stores' claim_homes."""

    def __init__(self) -> None:
        self.homes: dict[tuple[str, str], TopicPartition] = {}

    def claim(self, spec: Aggregate, feeders: Mapping[str, TopicPartition]
              ) -> dict[str, TopicPartition]:
        return {key: self.homes.setdefault((spec.id, key), fed) for key, fed in feeders.items()}


def orders(repartition: bool) -> Pipeline:
    """Orders {"id", "customer", "amount"} summed per customer."""
    p = Pipeline("shop", topics=("orders",), decode=lambda e: json.loads(e.payload))
    if repartition:
        p = p.repartition("by_customer", key=lambda o: o["customer"], partitions=2)
    return p.aggregate("per_customer", key=lambda o: o["customer"], init=lambda: 0,
                       fold=lambda total, o: total + o["amount"])


def order(partition: int, offset: int, customer: str, amount: int) -> Rec:
    return Rec("orders", partition, offset,
               envelope({"id": f"o{partition}-{offset}", "customer": customer, "amount": amount}))


def test_default_repartition_topic_and_consumed_topics() -> None:
    p = orders(repartition=True)
    assert p.repartitions[0].topic == "shop-by_customer-repartition"
    assert p.consumed_topics == ("orders", "shop-by_customer-repartition")
    with pytest.raises(ValueError, match="must differ"):
        Pipeline("x", topics=("t",)).repartition("r", key=str, topic="t")
    with pytest.raises(ValueError, match="at least 1"):
        Pipeline("x", topics=("t",)).repartition("r", key=str, partitions=0)


def test_two_workers_folding_one_key_from_two_partitions_dead_letter_the_second() -> None:
    homes, store = Homes(), Store()
    a = PipelineRunner(orders(False), store.load, "dlq", claim=homes.claim)
    b = PipelineRunner(orders(False), store.load, "dlq", claim=homes.claim)
    first = a.process([order(0, 0, "c1", 5)])
    second = b.process([order(1, 0, "c1", 7), order(1, 1, "c2", 1)])
    assert first.folded["per_customer"] == 1 and not first.outputs
    assert second.dead_letters == 1 and second.folded["per_customer"] == 1  # c2 is b's own
    reason = dict(second.outputs[0].headers)["onceflow.reason"].decode()
    assert "'per_customer'" in reason and "'c1'" in reason
    assert "orders/1" in reason and "orders/0" in reason and "repartition" in reason
    assert second.misaligned == {"per_customer": 1}
    assert second.misaligned_reason == {"per_customer": reason}
    assert b.tables[0].states["c1"].value == 0  # nothing folded into b's copy


def test_a_home_persisted_in_the_state_is_honoured_after_a_reload() -> None:
    homes, store = Homes(), Store()
    a = PipelineRunner(orders(False), store.load, "dlq", claim=homes.claim)
    a.process([order(0, 0, "c1", 5)])
    store.persist(a)
    assert decode_state(store.rows["c1"]).home == ("orders", 0)
    b = PipelineRunner(orders(False), store.load, "dlq", claim=Homes().claim)  # empty registry
    assert b.process([order(1, 0, "c1", 7)]).dead_letters == 1
    assert b.process([order(0, 1, "c1", 7)]).folded["per_customer"] == 1  # its home feeds it


def test_one_worker_setting_lets_a_key_draw_from_every_partition() -> None:
    runner = PipelineRunner(orders(False), Store().load, "dlq")  # claim=None: single worker
    outcome = runner.process([order(0, 0, "c1", 5), order(1, 0, "c1", 7)])
    assert outcome.dead_letters == 0 and runner.tables[0].states["c1"].value == 12


def hop(outputs: Sequence[Output], partition_of: Mapping[str, int], start: int = 0
        ) -> list[Rec]:
    """Produced repartition records as a consumer of that topic would see them."""
    records = []
    for i, out in enumerate(outputs):
        assert out.topic == "shop-by_customer-repartition" and out.key is not None
        records.append(Rec(out.topic, partition_of[out.key.decode()], start + i, out.value))
    return records


def test_repartition_routes_by_new_key_and_folds_exactly_once_through_the_hop() -> None:
    homes, store = Homes(), Store()
    upstream = PipelineRunner(orders(True), store.load, "dlq", claim=homes.claim)
    batch = [order(0, 0, "c1", 5), order(1, 0, "c1", 7), order(0, 1, "c2", 1)]
    produced = upstream.process(batch)
    assert [o.key for o in produced.outputs] == [b"c1", b"c1", b"c2"]
    chain = Envelope.FromString(produced.outputs[1].value).source_chain
    assert [(r.topic, r.partition, r.offset, r.index) for r in chain] == [("orders", 1, 0, 0)]
    # Two workers: one owns repartition partition 0 (c1), the other partition 1 (c2).
    where = {"c1": 0, "c2": 1}
    records = hop(produced.outputs, where)
    downstream = PipelineRunner(orders(True), store.load, "dlq", claim=homes.claim)
    folded = downstream.process(records)
    assert folded.dead_letters == 0
    assert {k: s.value for k, s in downstream.tables[0].states.items()} == {"c1": 12, "c2": 1}
    # A republisher that crashed re-sends its outputs at new offsets: discarded by the roots.
    again = downstream.process(hop(upstream.process(batch).outputs, where, start=3))
    assert again.duplicates["per_customer"] == 3 and again.folded["per_customer"] == 0
    assert {k: s.value for k, s in downstream.tables[0].states.items()} == {"c1": 12, "c2": 1}
    state = downstream.tables[0].states["c1"]
    assert state.home == ("shop-by_customer-repartition", 0)
    assert set(state.watermarks) == {("orders", 0), ("orders", 1)}
    assert decode_state(encode_state(state)).home == state.home


def test_a_record_failing_after_a_republish_step_produces_none_of_its_outputs() -> None:
    """Invariant 3: outputs are part of the unit, like states."""

    def fold(total: int, value: int) -> int:
        if value == 13:
            raise ValueError("unlucky")
        return total + value

    pipeline = (Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
                .flat_map("explode", lambda r: [(r["k"], x) for x in r["xs"]])
                .republish("out", "values", encode=lambda kv: json.dumps(kv).encode())
                .aggregate("sum", key=lambda kv: kv[0], init=lambda: 0,
                           fold=lambda s, kv: fold(s, kv[1])))
    runner = PipelineRunner(pipeline, Store().load, "dlq")
    outcome = runner.process([Rec("in", 0, 0, envelope({"k": "a", "xs": [1, 13]})),
                              Rec("in", 0, 1, envelope({"k": "a", "xs": [2]}))])
    assert outcome.dead_letters == 1
    assert [o.topic for o in outcome.outputs] == ["dlq", "values"]  # only record 1 produces
    assert json.loads(Envelope.FromString(outcome.outputs[1].value).payload) == ["a", 2]
    assert runner.tables[0].states["a"].value == 2


def test_events_that_overtook_each_other_through_two_re_keyings_are_all_folded() -> None:
    # orders -> by-customer (re-keyed) -> by-sku (re-keyed again) -> a sum per sku. Root
    # orders/0 reaches by-sku through two by-customer partitions, which interleave; only
    # along one path do positions rise, so the watermarks are kept per path.
    def line(root_offset: int, via: int, via_offset: int) -> testing.Record:
        return testing.Record(testing.envelope({"sku": "s", "n": root_offset}, key="s", chain=[
            ("orders", 0, root_offset, 0), ("by-customer", via, via_offset, 0)]))

    sums = (Pipeline("sums", topics=("by-sku",), decode=lambda e: json.loads(e.payload))
            .aggregate("per_sku", key=lambda v: v["sku"], init=lambda: 0,
                       fold=lambda total, v: total + v["n"]))
    run = testing.TestRun(sums)
    run.feed([line(2, 1, 0), line(1, 0, 0), line(4, 1, 1), line(3, 0, 1)])
    run.feed([line(3, 0, 1), line(1, 0, 5)])  # re-sent by each of the two writers
    assert run.states("per_sku") == {"s": 1 + 2 + 3 + 4}
    assert run.counters["per_sku.duplicates"] == 2
