"""Joins under replay: a replayed stream record meets the table row its first run met.

The table changes between a payment's first processing and its replay after a crash;
the merge log (``stages.merge_log``) replays the inputs in the order they were first
applied, and the table's versions (``stages.join_table``) give the row as of that
point, whatever the store holds by then and however the replay interleaves the two
topics. With ``ONCEFLOW_FAULT_NO_MERGE_LOG`` (arrival order, the newest row) the same
runs give another category and count a payment twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from onceflow import Pipeline, faults
from onceflow.stages import Table
from onceflow.stages.merge_log import Run
from onceflow.testing import Consumed, Record, TestRun

MERCHANTS = Table("merchants", format="json")


def payments(missing: str = "merge") -> Pipeline[Any]:
    return (Pipeline("pay", topics=("payments",), format="json")
            .join("merchant", table=MERCHANTS, on=lambda p: p["merchant"],
                  merge=lambda p, row: {**p, "category": None if row is None else row["cat"]},
                  missing=missing)  # type: ignore[arg-type]
            .republish("enriched", "enriched")
            .aggregate("totals", key=lambda v: str(v["category"]), init=lambda: 0,
                       fold=lambda total, v: total + v["amount"]))


def merchant(key: str, cat: str, partition: int = 0) -> Record:
    return Record({"cat": cat}, topic="merchants", key=key, partition=partition)


def payment(key: str, amount: int, partition: int = 0) -> Record:
    return Record({"merchant": key, "amount": amount}, topic="payments", partition=partition)


def tables_first(records: list[Consumed]) -> list[Consumed]:
    return sorted(records, key=lambda r: r.topic != "merchants")


def streams_first(records: list[Consumed]) -> list[Consumed]:
    return sorted(records, key=lambda r: r.topic != "payments")


def categories(run: TestRun) -> list[tuple[int, str]]:
    """(payment offset, category) of every output, first run and replays."""
    return [(value["offset"], value["category"])
            for value in (_payload(out.value) for out in run.outputs("enriched"))]


def _payload(data: bytes) -> dict[str, Any]:
    from onceflow.protos.envelope_pb2 import Envelope

    envelope = Envelope()
    envelope.ParseFromString(data)
    value = json.loads(envelope.payload)
    value["offset"] = envelope.source_chain[0].offset
    return value


def changed_between_run_and_replay(order: Callable[[list[Consumed]], Iterable[Consumed]] | None
                                   ) -> TestRun:
    """m1 is food when payment 0 is first processed, travel when it is replayed."""
    run = TestRun(payments())
    run.feed([merchant("m1", "food")])
    run.commit()
    run.feed([payment("m1", 5)])
    run.feed([merchant("m1", "travel")])
    run.persist()  # the table (at travel) and the totals written, nothing more committed
    run.crash(order=order)
    return run


@pytest.mark.parametrize("order", [None, tables_first, streams_first])
def test_a_replay_meets_the_row_its_first_run_met(order: Any) -> None:
    run = changed_between_run_and_replay(order)
    assert categories(run) == [(0, "food"), (0, "food")]  # first run, replay: the same
    assert run.states("totals") == {"food": 5}
    # a single worker (TestRun's default): one order over every partition, runs name theirs
    assert run.merge_log.runs[0] == [Run("merchants", 0, 0, 0), Run("payments", 0, 0, 0),
                                     Run("merchants", 1, 1, 0)]
    assert run.counters["merchant.duplicates"] == 1  # the replayed table record
    assert run.states("merchant") == {"m1": [[0, {"cat": "food"}], [1, {"cat": "travel"}]]}
    run.feed([payment("m1", 7)])  # past the log's tip: the newest row
    assert run.states("totals") == {"food": 5, "travel": 7}


@pytest.mark.parametrize("order", [None, tables_first])
def test_without_the_merge_log_the_replay_meets_the_newer_row(
        order: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "NO_MERGE_LOG", True)
    run = changed_between_run_and_replay(order)
    assert categories(run) == [(0, "food"), (0, "travel")]
    assert run.states("totals") == {"food": 5, "travel": 5}  # one payment counted twice


def test_a_replay_waits_for_the_table_records_its_log_puts_first() -> None:
    """Batches of one record, streams first: the payment waits for the table run."""
    run = TestRun(payments(), batch_size=1)
    run.feed([payment("m1", 1), merchant("m1", "food"), payment("m1", 2),
              merchant("m1", "toys"), payment("m1", 4)])
    first = categories(run)
    assert first == [(0, None), (1, "food"), (2, "toys")]
    run.crash(order=streams_first)
    assert categories(run)[3:] == first
    assert run.states("totals") == {"None": 1, "food": 2, "toys": 4}


def test_missing_rows_are_dropped_or_merged_with_none() -> None:
    run = TestRun(payments(missing="drop"))
    run.feed([payment("nobody", 3), merchant("m1", "food"), payment("m1", 2)])
    assert categories(run) == [(1, "food")]
    assert run.counters["merchant.has-row.folded"] == 0  # a filter: no counter of its own


def test_a_tombstone_deletes_the_row_and_a_bad_table_record_is_a_dead_letter() -> None:
    run = TestRun(payments())
    run.feed([merchant("m1", "food"), Record(b"{", topic="merchants", key="m1"),
              Record(b"x", topic="merchants"), payment("m1", 2)])
    assert len(run.dead_letters) == 2  # unparsable, no key
    assert categories(run) == [(0, "food")]
    run.feed([Record(None, topic="merchants", key="m1"), payment("m1", 1)])
    assert categories(run)[-1] == (1, None)


def test_co_partitions_are_ordered_apart() -> None:
    run = TestRun(payments(), single_worker=False)  # several workers: an order per partition
    run.feed([merchant("a", "x", 0), merchant("b", "y", 1), payment("a", 1, 0),
              payment("b", 2, 1)])
    assert run.merge_log.runs[1] == [Run("merchants", 0, 0), Run("payments", 0, 0)]
    assert run.states("totals") == {"x": 1, "y": 2}


HOMES = {"a": 0, "b": 1, "c": 0}  # co-partitioned: a key's rows and payments share one


def test_a_table_not_keyed_by_the_join_key_is_a_dead_letter() -> None:
    run = TestRun(payments())
    run.feed([merchant("a", "x", 1)])
    run.feed([payment("a", 1, 0)])
    assert [letter.reason for letter in run.dead_letters] == [
        "stage 'merchant': ValueError: key 'a' has its row in merchants/1, the value came "
        "from partition 0: the table must be keyed by the join key, with the stream's "
        "partition count"]


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, Any]]:
    steps = st.one_of(
        st.tuples(st.just("pay"), st.tuples(st.sampled_from("abc"), st.integers(1, 9))),
        st.tuples(st.just("row"), st.tuples(st.sampled_from("abc"), st.sampled_from("xyz"))),
        st.tuples(st.sampled_from(["persist", "commit"]), st.none()),
        st.tuples(st.just("crash"), st.sampled_from(["fed", "tables", "streams"])),
    )
    return draw(st.lists(steps, max_size=30))


@settings(max_examples=150, deadline=None)
@given(histories(), st.sampled_from([None, 1, 2, 3]))
# the new owner's snapshot moved the log's start onto the old owner's uncommitted run
# under its own epoch: the next reader dropped that run, and payment 2 met row y
@example([("row", ("a", "x")), ("pay", ("a", 1)), ("commit", None), ("pay", ("a", 2)),
          ("crash", "fed"), ("row", ("a", "y")), ("persist", None), ("crash", "tables")], None)
def test_every_replay_meets_the_rows_of_the_first_run(history: list[tuple[str, Any]],
                                                      batch_size: int | None) -> None:
    """Each payment's outputs (first run and every replay) carry the category its first
    processing met, and the totals count each payment once under that category."""
    run = TestRun(payments(), batch_size=batch_size)
    orders = {"fed": None, "tables": tables_first, "streams": streams_first}
    for kind, arg in history:
        if kind == "pay":
            run.feed([payment(arg[0], arg[1], HOMES[arg[0]])])
        elif kind == "row":
            run.feed([merchant(arg[0], arg[1], HOMES[arg[0]])])
        elif kind == "persist":
            run.persist()
        elif kind == "commit":
            run.commit()
        else:
            run.crash(order=orders[arg])
    first: dict[tuple[int, int], str] = {}
    for out in run.outputs("enriched"):
        value = _payload(out.value)
        slot = (_partition(out), value["offset"])
        assert first.setdefault(slot, value["category"]) == value["category"]
    truth: dict[str, int] = {}
    for record in run.log("payments"):
        category = first[(record.partition, record.offset)]
        amount = json.loads(record.value)["amount"]
        truth[str(category)] = truth.get(str(category), 0) + amount
    assert run.states("totals") == truth


def _partition(out: Any) -> int:
    from onceflow.protos.envelope_pb2 import Envelope

    envelope = Envelope()
    envelope.ParseFromString(out.value)
    return int(envelope.source_chain[0].partition)


def test_an_append_of_a_zombie_after_its_successors_is_dropped_when_read() -> None:
    from onceflow.kafka.merge_log_topic import decode_all, encode

    values = [encode(3, [Run("merchants", 0, 4)]), encode(5, [Run("payments", 0, 9)]),
              encode(3, [Run("payments", 0, 12)]), b"garbage", encode(5, [Run("merchants", 5, 5)])]
    assert decode_all(list(enumerate(values))) == [
        Run("merchants", 0, 4), Run("payments", 0, 9), Run("merchants", 5, 5)]
    # The successor (epoch 7) read up to offset 2 and marked it at 4; the zombie's append
    # at 3 (epoch 6) landed in between: it does not count.
    raced = [encode(6, [Run("payments", 0, 9)]), encode(6, [Run("merchants", 0, 4)]),
             encode(6, []), encode(6, [Run("payments", 10, 12)]), encode(7, [], after=2),
             encode(7, [Run("merchants", 5, 6)])]
    assert decode_all(list(enumerate(raced))) == [
        Run("payments", 0, 9), Run("merchants", 0, 4), Run("merchants", 5, 6)]


def test_a_forgotten_topics_runs_before_its_forget_record_order_nothing() -> None:
    """``onceflow forget --topic merchants`` (the topic re-created, offsets from 0): its old
    runs would make a replay wait below its new positions; the stream's runs stay, and
    the new topic's runs after the record count."""
    from onceflow.kafka.merge_log_topic import decode_all, encode, encode_forget

    values = [encode(3, [Run("merchants", 0, 4), Run("payments", 0, 9)]),
              encode(3, [Run("merchants", 5, 8, 1)]), encode_forget(9, "merchants"),
              encode(3, [Run("merchants", 9, 9)]),  # a zombie's, below the forget's epoch
              encode(10, [Run("merchants", 0, 2), Run("payments", 10, 11)])]
    assert decode_all(list(enumerate(values))) == [
        Run("payments", 0, 9), Run("merchants", 0, 2), Run("payments", 10, 11)]


def test_the_start_refuses_topics_of_other_counts_and_a_split_assignment() -> None:
    from onceflow.runtime.join_setup import mismatches
    from onceflow.stages.join_runner import JoinRunner, NotCoAssigned
    from onceflow.stages.merge_log import MemoryMergeLog

    assert mismatches(payments(), {"payments": 4, "merchants": 4}) == []
    assert mismatches(payments(), {"payments": 4, "merchants": 3}) == [
        "join 'merchant': stream topic 'payments' has 4 partitions, table topic 'merchants' "
        "has 3: a join needs the same count on both (docs/guide/joins.md)"]
    runner = JoinRunner(payments(), lambda spec, keys: {}, "dead", merge_log=MemoryMergeLog())
    runner.start({("payments", 0): 0, ("merchants", 0): 0, ("payments", 1): 3,
                  ("merchants", 1): 2})
    with pytest.raises(NotCoAssigned, match=r"partition 1 of \['merchants'\] is not assigned"):
        runner.start({("payments", 0): 0, ("merchants", 0): 0, ("payments", 1): 3})


def test_what_a_join_may_not_combine_is_refused_when_built() -> None:
    from onceflow import ProducerDedup

    with pytest.raises(ValueError, match="its table topic 'payments' must be no source topic"):
        Pipeline("p", topics=("payments",)).join(
            "j", table=Table("payments"), on=str, merge=lambda v, row: v)
    with pytest.raises(ValueError, match="a join with dedup= is not supported yet"):
        Pipeline("p", topics=("payments",), dedup=ProducerDedup(str, len, store="redis")).join(
            "j", table=MERCHANTS, on=str, merge=lambda v, row: v)
    with pytest.raises(ValueError, match="missing='keep': expected one of merge, drop"):
        Pipeline("p", topics=("payments",)).join(
            "j", table=MERCHANTS, on=str, merge=lambda v, row: v, missing="keep")  # type: ignore[arg-type]
    assert payments().consumed_topics == ("payments", "merchants")


def test_a_join_tables_rows_are_bounded_by_the_state_cache_and_reloaded_on_a_miss() -> None:
    """``max_states`` bounds a join's rows as it does an aggregate's: written rows beyond it
    are evicted (least recently used first), and a stream value meeting one loads it."""
    from onceflow.protos.envelope_pb2 import Envelope
    from onceflow.stages.join_runner import JoinRunner
    from onceflow.stages.merge_log import MemoryMergeLog
    from onceflow.stages.state import decode_state
    from onceflow.testing import Consumed

    stored: dict[tuple[str, str], bytes] = {}

    def load(spec: Any, keys: Any) -> dict[str, Any]:
        return {k: decode_state(stored[(spec.id, k)]) for k in keys if (spec.id, k) in stored}

    runner = JoinRunner(payments(), load, "dead", merge_log=MemoryMergeLog(), max_states=2)
    merchants = [Consumed("merchants", 0, n, json.dumps({"cat": f"c{n}"}).encode(),
                          f"m{n}".encode()) for n in range(5)]
    runner.process(merchants)
    table = runner.joins["merchant"].table
    for key, row in table.take_dirty(1).items():
        stored[("merchant", key)] = row
    table.written(1)
    assert table.evict() == 3 and len(table.states) == 2
    paid = [Consumed("payments", 0, n, json.dumps({"merchant": f"m{n}", "amount": 1}).encode(),
                     f"m{n}".encode()) for n in range(5)]
    outcome = runner.process(paid)
    cats = sorted(json.loads(Envelope.FromString(out.value).payload)["category"]
                  for out in outcome.outputs if out.topic == "enriched")
    assert cats == [f"c{n}" for n in range(5)]  # every row as written, evicted or not
