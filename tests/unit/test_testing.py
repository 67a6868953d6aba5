"""onceflow.testing: pipelines run in memory through the worker's runner."""

from __future__ import annotations

import doctest
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner
from test_windows import MINUTE, windowed

import onceflow.testing
from onceflow.examples import orders
from onceflow.stages import Pipeline
from onceflow.testing import Record, TestRun, envelope, partition_for


def sums() -> Pipeline:
    """Each record is {"k": key, "xs": [numbers]}; flat-map the numbers, sum per key."""
    return (
        Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: [(r["k"], x) for x in r["xs"]])
        .aggregate("sum", key=lambda kv: kv[0], init=lambda: 0, fold=lambda s, kv: s + kv[1])
    )


def test_the_module_docstring_example_runs() -> None:
    result = doctest.testmod(onceflow.testing)
    assert result.attempted >= 10 and result.failed == 0


def test_the_guide_example_runs() -> None:
    guide = Path(__file__).parents[2] / "docs" / "guide"
    pipelines, testing = ((guide / page).read_text() for page in
                          ("pipelines-and-steps.md", "testing.md"))
    namespace: dict[str, Any] = {}
    exec(re.findall(r"```python\n(.*?)```", pipelines, re.S)[0], namespace)  # "Writing a pipeline"
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", testing, re.S)
                  if "onceflow.testing" in block]
    exec(example, namespace)
    namespace["test_counts_are_exact_under_a_crash"]()


def test_states_are_decoded_as_the_store_would_hold_them() -> None:
    pipeline = (Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
                .aggregate("last", key=lambda r: r["k"], init=lambda: (0, 0),
                           fold=lambda s, r: (s[0] + 1, r["x"])))
    run = TestRun(pipeline)
    run.feed([Record({"k": "a", "x": 1}), Record({"k": "a", "x": 2}), Record({"k": "b", "x": 3})])
    assert run.states("last") == {"a": [2, 2], "b": [1, 3]}  # tuples come back as JSON lists
    assert run.states("last", persisted=True) == {}
    run.persist()
    assert run.states("last", persisted=True) == {"a": [2, 2], "b": [1, 3]}
    assert run.watermarks("last", "a") == {("in", 0): (1,)}
    assert run.counters == {"records": 3, "last.folded": 3}
    with pytest.raises(KeyError, match="no aggregate 'nope'"):
        run.states("nope")


def test_republished_outputs_carry_their_source_chain() -> None:
    pipeline = (
        Pipeline("r", topics=("raw",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: r["xs"])
        .republish("out", "mid", encode=lambda x: json.dumps(x).encode(), key=str)
    )
    run = TestRun(pipeline)
    run.feed([Record({"xs": [7]}), Record(envelope({"xs": [8, 9]}, chain=[("src", 1, 3, 2)]))])
    outputs = run.outputs()
    assert run.outputs("mid") == outputs and run.outputs("elsewhere") == []
    assert [(o.topic, o.key, o.json) for o in outputs] == [
        ("mid", b"7", 7), ("mid", b"8", 8), ("mid", b"9", 9)]
    chains = [[(r.topic, r.partition, r.offset, r.index) for r in o.envelope.source_chain]
              for o in outputs]
    assert chains == [[("raw", 0, 0, 0)],
                      [("src", 1, 3, 2), ("raw", 0, 1, 0)],
                      [("src", 1, 3, 2), ("raw", 0, 1, 1)]]
    assert [o.envelope.event_id for o in outputs] == ["raw/0/0.0", "src/1/3.2.0", "src/1/3.2.1"]


def test_a_record_key_is_the_kafka_key_given_as_bytes_or_str() -> None:
    seen: list[bytes | None] = []
    raw = (Pipeline("p", topics=("in",), format="json", with_meta=True)
           .map("meta", lambda pair: seen.append(pair[1].key) or pair[0])
           .republish("out", "out"))
    run = TestRun(raw)
    fed = run.feed([Record({"v": 1}, key=b"m-1"), Record({"v": 2}, key="m-1"),
                    Record({"v": 3}, key=b"\xffm"), Record({"v": 4})])
    assert [r.key for r in fed] == seen == [b"m-1", b"m-1", b"\xffm", None]
    # a republish's default key is the Kafka key as the worker reads it: UTF-8, bad bytes replaced
    assert [o.key for o in run.outputs("out")] == [b"m-1", b"m-1", "\ufffdm".encode(), None]
    run = TestRun(Pipeline("e", topics=("in",), decode=lambda e: json.loads(e.payload))
                  .republish("out", "out"))
    (record,) = run.feed([Record({"v": 1}, key=b"m-1")])
    assert (record.key, record.envelope.key) == (b"m-1", "m-1")
    assert [o.key for o in run.outputs("out")] == [b"m-1"]
    with pytest.raises(TypeError, match=r"^Record key must be bytes, str or None \(the Kafka "
                                        r"record's key\), got int 5$"):
        Record({"v": 1}, key=5)  # type: ignore[arg-type]


def test_a_failing_function_and_an_undecodable_record_become_dead_letters() -> None:
    def explode(r: dict[str, Any]) -> list[tuple[str, int]]:
        if r["xs"] == "boom":
            raise ValueError("no numbers")
        return [(r["k"], x) for x in r["xs"]]

    def add(total: int, kv: tuple[str, int]) -> int:
        if kv[1] < 0:
            raise ValueError("negative")
        return total + kv[1]

    pipeline = (Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
                .flat_map("explode", explode)
                .aggregate("sum", key=lambda kv: kv[0], init=lambda: 0, fold=add))
    run = TestRun(pipeline)
    fed = run.feed([Record({"k": "a", "xs": [1]}), Record({"k": "a", "xs": "boom"}),
                    Record(b"\xff\xff not protobuf", partition=3, offset=8),
                    Record({"k": "z", "xs": [-1]}), Record({"k": "a", "xs": [2]})])
    assert run.states("sum") == {"a": 3}  # "z" was never folded: no state to write
    boom, garbage, negative = run.dead_letters
    assert boom.record == fed[1] and boom.reason == "stage 'explode': ValueError: no numbers"
    assert garbage.record == fed[2] and garbage.reason.startswith("undecodable envelope")
    assert negative.record == fed[3]
    assert negative.reason == "stage 'sum', key 'z': ValueError: negative"
    assert run.outputs() == [] and len(run.outputs(run.dead_letter_topic)) == 3
    assert run.counters["dead_letters"] == 3
    run.commit()
    assert run.committed == {("in", 0): 4, ("in", 3): 9}  # dead letters are consumed too


def test_late_events_and_windows() -> None:
    run = TestRun(windowed(lateness_ms=10_000))
    fed = run.feed([Record({"k": "a", "ts": [50_000, 65_000]}),
                    Record({"k": "a", "ts": [71_000]})])  # the watermark closes minute 0
    fed += run.feed([Record({"k": "a", "ts": [1_000, 72_000]})])  # 1_000 is late
    (late,) = run.late
    assert (late.record, late.stage, late.key, late.position) == (fed[2], "per_minute", "a", "2.0")
    assert late.reason == "late for stage 'per_minute' by 1000 ms"
    assert run.counters["per_minute.late"] == 1 and run.counters["per_minute.folded"] == 4
    assert run.closed_windows("per_minute") == {("a", 0): 1}
    assert run.closed_windows("per_minute", persisted=True) == {}
    assert run.windows("per_minute") == {("a", 0): 1, ("a", MINUTE): 3}
    run.persist()
    assert run.closed_windows("per_minute", persisted=True) == {("a", 0): 1}
    run.duplicate(fed[2])  # a late value replayed is a duplicate, not late again
    assert len(run.late) == 1 and run.counters["per_minute.duplicates"] == 2


def test_a_crash_replays_from_the_commit_and_the_replay_is_discarded() -> None:
    records = [Record({"k": f"k{o % 3}", "xs": [o, 1]}) for o in range(20)]
    run = TestRun(sums(), persist_every=4, commit_every=10)
    run.feed(records[:17])  # persisted after 4, 8, 10 (and committed), 12 and 16 records
    assert run.committed == {("in", 0): 10}
    run.crash()  # replays offsets 10..16, of which 10..15 were persisted
    assert run.counters["sum.duplicates"] == 2 * 6
    assert run.counters["sum.folded"] == 2 * (17 + 1)  # 16 was lost, so folded again
    run.feed(records[17:])
    run.commit()
    expected = {f"k{k}": sum(o + 1 for o in range(20) if o % 3 == k) for k in range(3)}
    assert run.states("sum", persisted=True) == expected
    run.crash()  # everything committed: nothing to replay
    assert run.states("sum") == expected and run.crashes == 2
    assert run.counters["records"] == 20 + 7


def test_replay_and_duplicate_keep_in_memory_states_exact() -> None:
    run = TestRun(sums())
    fed = run.feed([Record({"k": "a", "xs": [1, 2]}), Record({"k": "a", "xs": [3]})])
    run.duplicate(fed[1], fed[0])
    run.replay({("in", 0): 1})
    assert run.states("sum") == {"a": 6}
    assert run.counters["sum.duplicates"] == 4 and run.counters["records"] == 5
    with pytest.raises(ValueError, match="offset 1 is taken"):
        run.feed([Record({"k": "a", "xs": [1]}, offset=1)])


def test_a_nondeterministic_flat_map_is_caught_by_a_crash() -> None:
    """What the harness is for: this pipeline folds every value once only without replays."""
    calls = itertools.count()

    def shuffled(r: dict[str, Any]) -> list[tuple[str, int]]:
        pairs = [(k, 1) for k in r["ks"]]
        return pairs if next(calls) % 2 == 0 else pairs[::-1]  # order differs on replay

    pipeline = (Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
                .flat_map("explode", shuffled)
                .aggregate("n", key=lambda kv: kv[0], init=lambda: 0, fold=lambda s, kv: s + 1))
    run = TestRun(pipeline)
    run.feed([Record({"ks": ["a", "b"]})])
    run.persist()  # persisted, never committed: the crash replays offset 0
    run.crash()
    assert run.states("n") == {"a": 2, "b": 1}  # not {"a": 1, "b": 1}


def test_a_repartition_round_trip_runs_end_to_end() -> None:
    pipeline = orders.build("orders")
    hop = "orders-by_customer-repartition"
    run = TestRun(pipeline, single_worker=False, partitions=4)
    amounts = {"c1": 0, "c2": 0, "c3": 0}
    fed = []
    for i in range(12):
        customer = f"c{i % 3 + 1}"
        amounts[customer] += i
        fed.append(Record({"id": f"o{i}", "customer": customer, "amount": i}, partition=i % 4))
    run.feed(fed)
    run.persist()
    assert run.dead_letters == [] and run.counters["per_customer.misaligned"] == 0
    expected = {c: {"orders": 4, "amount": a} for c, a in amounts.items()}
    assert run.states("per_customer") == expected
    hopped = run.log(hop)
    assert len(hopped) == 12 and [o.key for o in run.outputs(hop)] == [r.key for r in hopped]
    kafka, four = DefaultPartitioner(), [0, 1, 2, 3]
    for record in hopped:  # where Kafka's default partitioner puts the key
        assert record.partition == partition_for(record.key, 4) == kafka(record.key, four, four)
    assert len({record.partition for record in hopped}) > 1
    run.crash()  # nothing committed: every order and every hop record is replayed
    assert run.states("per_customer") == expected
    assert run.counters["per_customer.duplicates"] == 12 * 2  # old hop records + re-sent ones
    assert len(run.log(hop)) == 24


def test_key_homes_refuse_a_key_fed_from_two_partitions_unless_single_worker() -> None:
    fed = [Record({"id": "o1", "customer": "c1", "amount": 5}, partition=0),
           Record({"id": "o2", "customer": "c1", "amount": 7}, partition=1)]
    shared = TestRun(orders.build_unaligned("orders"), single_worker=False)
    shared.feed(fed)
    (dead,) = shared.dead_letters
    assert dead.record.partition == 1
    assert "'c1'" in dead.reason and "orders/1" in dead.reason and "orders/0" in dead.reason
    assert shared.counters["per_customer.misaligned"] == 1
    shared.persist()
    assert shared.states("per_customer") == {"c1": {"orders": 1, "amount": 5}}
    alone = TestRun(orders.build_unaligned("orders"))
    alone.feed(fed)
    assert alone.states("per_customer") == {"c1": {"orders": 2, "amount": 12}}



def test_a_filter_drops_values_without_dead_letters_and_replays_stay_exact() -> None:
    pipeline = (
        Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
        .flat_map("explode", lambda r: [(r["k"], x) for x in r["xs"]])
        .filter("odd", lambda kv: kv[1] % 2 == 1)
        .aggregate("sum", key=lambda kv: kv[0], init=lambda: 0, fold=lambda s, kv: s + kv[1])
    )
    run = TestRun(pipeline, persist_every=2)
    run.feed([Record({"k": "a", "xs": [1, 2, 3]}), Record({"k": "a", "xs": [4, 5]}),
              Record({"k": "b", "xs": [2]}), Record({"k": "a", "xs": [7, 8, 9]})])
    assert run.states("sum") == {"a": 25} and run.dead_letters == []
    run.crash()  # nothing was committed: every record replays, against the stored states
    assert run.states("sum") == {"a": 25} and run.counters["sum.duplicates"] == 5
    assert run.watermarks("sum", "a") == {("in", 0): (3, 2)}  # 9 was value 2 of offset 3
