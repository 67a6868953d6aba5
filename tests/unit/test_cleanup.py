"""The cleanup of a regrouped topic (``onceflow.cleanup``): each event once, in order.

The regrouped records are fed as a re-keying republisher writes them: plain
JSON with the origin in headers, or envelopes, each with its source chain.
A re-sent copy has the same chain at a new offset.
"""

from __future__ import annotations

import json

import pytest
from test_runner import Rec

from onceflow import Pipeline, cleanup
from onceflow.examples.regroup import build_cleanup, build_regroup
from onceflow.protos.envelope_pb2 import SourceRef
from onceflow.stages.origin import plain_headers
from onceflow.stages.runner import PipelineRunner
from onceflow.testing import Record, TestRun, envelope, partition_for

REGROUPED, PRISTINE = "by-sku", "by-sku-pristine"


def line(root: int, offset: int, index: int, partition: int = 0, sku: str = "s1",
         via: tuple[int, int] | None = None) -> Record:
    """Output ``index`` of input ``offset`` of root partition ``orders/root``, as a plain
    JSON record of the regrouped topic's ``partition``; ``via=(q, o)``: re-keyed twice, the
    second time from offset ``o`` of partition ``q`` of ``by-customer`` (itself regrouped)."""
    chain = [SourceRef(topic="orders", partition=root, offset=offset, index=index)]
    if via is not None:
        chain.append(SourceRef(topic="by-customer", partition=via[0], offset=via[1], index=0))
    value = {"order": f"{root}:{offset}", "line": index, "sku": sku}
    headers = (("onceflow-format", b"json"),
               *plain_headers(chain, f"orders/{root}/{offset}.{index}", 1000 + offset))
    return Record(json.dumps(value).encode(), partition=partition, key=sku, headers=headers)


def forwarded(run: TestRun) -> list[tuple[str, int]]:
    return [(v["order"], v["line"]) for v in (json.loads(p.value) for p in run.outputs())]


def new_run(**options: int) -> TestRun:
    return TestRun(cleanup("c", REGROUPED, PRISTINE), single_worker=False, **options)


def test_a_re_sent_copy_of_a_regrouped_record_is_not_forwarded() -> None:
    run = new_run()
    run.feed([line(0, 5, 0), line(0, 5, 1), line(0, 6, 0)])
    run.feed([line(0, 5, 1), line(0, 6, 0), line(0, 7, 0)])  # a crashed writer's re-send
    assert forwarded(run) == [("0:5", 0), ("0:5", 1), ("0:6", 0), ("0:7", 0)]
    assert run.states("first_seen") == {"0": 4}
    assert run.counters["first_seen.duplicates"] == 2
    assert run.watermarks("first_seen", "0") == {("orders", 0): (7, 0)}


def test_interleaved_roots_keep_their_own_watermarks() -> None:
    run = new_run()
    run.feed([line(0, 1, 0), line(1, 1, 0), line(0, 2, 0), line(1, 9, 0),
              line(1, 1, 0),                  # root 1 re-sent from offset 1
              line(0, 3, 0),                  # root 0 goes on: new, below root 1's mark
              line(1, 9, 0), line(1, 10, 0)])
    assert forwarded(run) == [("0:1", 0), ("1:1", 0), ("0:2", 0), ("1:9", 0), ("0:3", 0),
                              ("1:10", 0)]
    assert run.watermarks("first_seen", "0") == {("orders", 0): (3, 0), ("orders", 1): (10, 0)}


def test_each_regrouped_partition_deduplicates_on_its_own() -> None:
    # One input's lines land in two regrouped partitions; a copy in one says nothing
    # about the other.
    run = new_run()
    run.feed([line(0, 4, 0, partition=0), line(0, 4, 1, partition=1),
              line(0, 4, 0, partition=0), line(0, 5, 0, partition=1)])
    assert forwarded(run) == [("0:4", 0), ("0:4", 1), ("0:5", 0)]
    assert run.states("first_seen") == {"0": 1, "1": 2}
    assert not run.dead_letters  # each key is fed from its own partition only


def test_a_topic_re_keyed_twice_is_cleaned_without_loss_whatever_the_interleaving() -> None:
    # orders -> by-customer (re-keyed) -> by-sku (re-keyed again). Root 0's events reach
    # by-sku through two by-customer partitions, which interleave: offset 2 (via
    # by-customer/1) overtakes offset 1 (via by-customer/0). One watermark per root would
    # take offset 1 for a copy; the watermarks are kept per path (lineage.route_of).
    run = new_run()
    run.feed([line(0, 2, 0, via=(1, 0)), line(0, 1, 0, via=(0, 0)), line(0, 4, 0, via=(1, 1)),
              line(0, 3, 0, via=(0, 1)),
              line(0, 1, 0, via=(0, 0)),   # the by-sku writer of by-customer/0 re-sends
              line(0, 3, 0, via=(0, 7)),   # a copy already in by-customer (at a new offset)
              line(0, 5, 0, via=(0, 8))])
    assert forwarded(run) == [("0:2", 0), ("0:1", 0), ("0:4", 0), ("0:3", 0), ("0:5", 0)]
    assert run.counters["first_seen.duplicates"] == 2
    assert run.watermarks("first_seen", "0") == {("orders/0>by-customer", 0): (5, 0, 0),
                                                 ("orders/0>by-customer", 1): (4, 0, 0)}


def test_a_crash_after_the_state_is_written_forwards_nothing_again() -> None:
    run = new_run()
    run.feed([line(0, 1, 0), line(0, 2, 0)])
    run.commit()
    run.feed([line(0, 3, 0), line(0, 4, 0)])
    run.persist()                       # state written, offsets not committed
    run.feed([line(0, 4, 0), line(0, 5, 0)])  # a copy, then a new one; not persisted
    run.crash()                         # replays from the commit: offsets 2..5
    assert forwarded(run) == [("0:1", 0), ("0:2", 0), ("0:3", 0), ("0:4", 0), ("0:5", 0),
                              ("0:5", 0)]  # only 0:5 again, which the lost state had passed
    # (the real worker's exclusive tail skips that one: it is in the pristine topic)
    assert run.states("first_seen") == {"0": 5}
    assert run.watermarks("first_seen", "0") == {("orders", 0): (5, 0)}


def test_envelopes_are_cleaned_by_their_chains_too() -> None:
    run = TestRun(cleanup("c", REGROUPED, PRISTINE, regrouped_format="envelope"))
    first = envelope({"n": 1}, key="k", chain=[("orders", 2, 8, 0)])
    second = envelope({"n": 2}, key="k", chain=[("orders", 2, 8, 1)])
    run.feed([Record(first), Record(second), Record(first), Record(second)])
    assert [json.loads(p.value) for p in run.outputs()] == [{"n": 1}, {"n": 2}]
    assert run.counters["first_seen.duplicates"] == 2


def test_the_pristine_record_is_the_regrouped_one_with_its_chain_extended() -> None:
    runner = PipelineRunner(cleanup("c", REGROUPED, PRISTINE), lambda spec, keys: {}, "dead")
    record = line(1, 7, 2, partition=3, sku="s9")
    value = record.value
    assert isinstance(value, bytes)
    out, = runner.process([Rec(REGROUPED, 3, 40, value, b"s9", tuple(record.headers))]).outputs
    headers = dict(out.headers)
    assert (out.topic, out.partition, out.key, out.value) == (PRISTINE, 3, b"s9", value)
    assert headers["onceflow-format"] == b"json"
    assert headers["onceflow-chain"] == f"orders/1/7/2,{REGROUPED}/3/40/0".encode()
    assert headers["onceflow-event-time-ms"] == b"1007"


def test_deduplicate_is_an_aggregate_counting_what_it_let_through() -> None:
    pipeline = (Pipeline("p", topics=("t",), format="json")
                .deduplicate("once", key=lambda v: v["k"], store="cassandra"))
    step, = pipeline.aggregates
    assert (step.id, step.store, step.init(), step.fold(3, "anything")) == ("once", "cassandra",
                                                                            0, 4)


def test_a_regrouped_format_that_is_none_of_the_three_is_refused() -> None:
    with pytest.raises(ValueError, match="regrouped_format 'str'"):
        cleanup("c", REGROUPED, PRISTINE, regrouped_format="str")


def test_the_regroup_example_re_sends_after_a_crash_and_its_cleanup_drops_the_copies() -> None:
    orders = [{"order": f"o{i}", "customer": f"c{i % 3}",
               "lines": [{"sku": f"s{(i + j) % 5}", "qty": j} for j in range(1 + i % 3)]}
              for i in range(12)]
    regroup = TestRun(build_regroup("orders", REGROUPED))
    regroup.feed([Record(order, partition=i % 2) for i, order in enumerate(orders[:6])])
    regroup.commit()
    regroup.feed([Record(order, partition=i % 2) for i, order in enumerate(orders[6:])])
    regroup.crash()  # uncommitted: orders 6.. are regrouped again
    copies = regroup.outputs()
    assert len(copies) > len({(p.value, p.headers["onceflow-chain"]) for p in copies})
    clean = TestRun(build_cleanup(REGROUPED, PRISTINE), single_worker=False)
    clean.feed([Record(p.value, partition=partition_for(p.key, 4), key=(p.key or b"").decode(),
                       headers=tuple((k, v.encode()) for k, v in p.headers.items()))
                for p in copies])
    got = [(v["order"], v["line"]) for v in (json.loads(p.value) for p in clean.outputs())]
    want = [(order["order"], j) for order in orders for j in range(len(order["lines"]))]
    assert sorted(got) == sorted(want)
