"""Log marks: what a snapshot keeps of each input log, and what ``onceflow forget`` drops.

The check against a real broker (delete + create, shorter and grown past)
is ``tests/integration/test_recreated_topic.py``; here the pure parts: the
mark and its comparison, the ledger carrying marks into checkpoints, and
``forget_topic``'s rewrite of every kind of row on a dict store.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaPartition
from persistence_doubles import DictStore

from onceflow.actors.messages import Snapshot, StageRows
from onceflow.checkpoint.ledger import Ledger
from onceflow.checkpoint.log_marks import (
    LOGS_STAGE,
    NO_MARK,
    LogCheck,
    LogMark,
    LogReplaced,
    Told,
    downstream_note,
    forgotten_rows,
    judge,
    mark_of,
)
from onceflow.checkpoint.persistence import StoreWriter
from onceflow.kafka.continuity import PartitionRewound
from onceflow.runtime.forget import forget_topic
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, PartitionSequences
from onceflow.stages.state import AggregateState, TopicPartition, decode_state, encode_state
from onceflow.stages.watermark import WINDOWS_STAGE
from onceflow.stores.fencing import Fenced
from onceflow.stores.fencing.held_epochs import EpochFence

A: TopicPartition = ("orders", 0)


@dataclass
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def test_a_mark_tells_records_apart_by_timestamp_key_and_value() -> None:
    base = mark_of(Record(7, 1000, b"k", b"v"))
    assert base == mark_of(Record(7, 1000, b"k", b"v"))
    assert LogMark.decode(base.encode()) == base
    assert mark_of(Record(7, 1001, b"k", b"v")) != base
    others = [Record(7, 1000, b"K", b"v"),
              Record(7, 1000, b"k", b"w"), Record(7, 1000, None, b"v"),
              Record(7, 1000, b"", b"v"), Record(7, 1000, b"kv", b""),
              Record(7, 1000, b"k", None)]
    assert len({mark_of(r).digest for r in others} | {base.digest}) == len(others) + 1


def test_judge_refuses_another_record_at_the_mark_and_accepts_a_hole() -> None:
    mark = mark_of(Record(41, 1000, b"k", b"v"))
    judge(A, mark, Record(41, 1000, b"k", b"v"))  # the same record: the same log
    judge(A, mark, Record(44, 5, b"x", b"y"))  # compacted away: cannot tell, accepted
    with pytest.raises(LogReplaced, match=r"orders\[0\] is not the log .* up to offset 41, "
                       r"and its record at offset 41 differs") as refused:
        judge(A, mark, Record(41, 2000, b"k", b"v"))
    assert isinstance(refused.value, PartitionRewound)  # permanent: the worker exits 1
    assert "onceflow forget --topic orders" in str(refused.value)
    assert "new name" in str(refused.value)


def test_a_hole_at_the_mark_is_warned_about_once_per_mark(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Checks repeat before every send until the next snapshot moves the mark: one WARNING
    per mark, not one per check."""
    told: Told = {}
    mark, later = mark_of(Record(41, 1000, b"k", b"v")), mark_of(Record(50, 1000, b"k", b"w"))
    with caplog.at_level(logging.DEBUG, logger="onceflow.checkpoint.log_marks"):
        for _ in range(3):
            judge(A, mark, Record(44, 5, b"x", b"y"), told)
        judge(A, later, Record(52, 5, b"x", b"y"), told)
    levels = [(r.levelname, "offset 41" in r.getMessage()) for r in caplog.records]
    assert levels == [("WARNING", True), ("DEBUG", True), ("DEBUG", True), ("WARNING", False)]
    assert told == {A: 50}  # one entry per partition: no list of old marks in a long run


def test_the_ledger_hands_each_partitions_last_processed_record_to_the_next_checkpoint(
) -> None:
    ledger = Ledger()
    ledger.assigned({A: 0})
    first, last = LogMark(0, 1, "a"), LogMark(9, 2, "b")
    ledger.processed({A: 1}, sent=False, marks={A: first})
    ledger.processed({A: 10}, sent=False, marks={A: last})
    ledger.processed({A: 5}, sent=False, marks={A: LogMark(4, 3, "replay")})  # a replay
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None and checkpoint.marks == {A: last}
    again = ledger.take(dirty=True)
    assert again is not None and again.marks == {}  # nothing new since
    ledger.processed({A: 11}, sent=False, marks={A: LogMark(10, 4, "c")})
    ledger.written(checkpoint)
    ledger.written(again)
    ledger.take(dirty=True)  # takes the mark at 10 into a checkpoint not written yet
    ledger.processed({A: 12}, sent=False, marks={A: LogMark(11, 5, "d")})
    with pytest.raises(Exception, match="not written"):
        ledger.forget([A])  # processed, not written: forgetting would lose it


def _pipeline() -> Pipeline:
    from onceflow.examples.robots import report_dedup

    return (Pipeline("p", topics=("orders", "refunds"), format="json",
                     dedup=report_dedup("mem"))
            .aggregate("totals", key=str, init=int, fold=lambda s, v: s + 1, store="mem"))


def test_forget_drops_the_topics_watermarks_tables_and_marks_and_nothing_else() -> None:
    store = DictStore()
    state = AggregateState(7, {("orders", 0): (40,), ("orders", 1): (9, 2),
                               ("orders/1>by-key", 3): (12,), ("refunds", 0): (5,)},
                           home=("orders", 1))
    store.rows[("totals", "k1")] = encode_state(state)
    untouched = encode_state(AggregateState(1, {("refunds", 1): (3,)}))
    store.rows[("totals", "k2")] = untouched
    table = PartitionSequences(next_offset=41, duplicates=3,
                               producers={"robot-1": [0, 17, 5]})
    store.rows[(SEQUENCE_STAGE, "orders|0")] = table.encode()
    store.rows[(SEQUENCE_STAGE, "refunds|0")] = table.encode()
    store.rows[(LOGS_STAGE, "orders|2")] = LogMark(40, 1, "d").encode()
    store.rows[(LOGS_STAGE, "refunds|0")] = LogMark(4, 1, "e").encode()
    store.rows[(WINDOWS_STAGE, "m|wm|orders|0")] = json.dumps(
        {"r": [["orders", 0, 100]], "v": 90}).encode()
    store.rows[(WINDOWS_STAGE, "m|wm|mix|0")] = json.dumps(
        {"r": [["orders", 0, 100], ["refunds", 0, 80]], "v": 70}).encode()

    done = forget_topic({"mem": store}, _pipeline(), "orders")

    after = decode_state(store.rows[("totals", "k1")])
    assert (after.value, after.home) == (7, ("orders", 1))  # counted events stay counted
    assert after.watermarks == {("refunds", 0): (5,)}
    assert store.rows[("totals", "k2")] == untouched
    reset = PartitionSequences.decode(store.rows[(SEQUENCE_STAGE, "orders|0")])
    assert (reset.next_offset, reset.producers, reset.duplicates) == (0, {}, 3)
    assert store.rows[(SEQUENCE_STAGE, "refunds|0")] == table.encode()
    assert store.rows[(LOGS_STAGE, "orders|2")] == NO_MARK
    assert store.rows[(LOGS_STAGE, "orders|2|generation")] == b"1"
    assert LogMark.decode(store.rows[(LOGS_STAGE, "refunds|0")]).offset == 4
    assert done.watermarks == 5 and done.partitions == {0, 1, 2}
    # A windowed stage's partition watermark: the topic's roots go; one left with none
    # starts over, one still fed by another root keeps its value.
    assert json.loads(store.rows[(WINDOWS_STAGE, "m|wm|orders|0")]) == {"r": [], "v": None}
    assert json.loads(store.rows[(WINDOWS_STAGE, "m|wm|mix|0")]) == {
        "r": [["refunds", 0, 80]], "v": 70}
    # Written under a new epoch of the topic's partitions (a worker left running is fenced).
    assert store.guards and all(g == {("orders", p): 1 for p in (0, 1, 2)} for g in store.guards)
    assert forget_topic({"mem": store}, _pipeline(), "orders").rows == {}  # done is done


@pytest.mark.parametrize("held", [True, False], ids=["held", "taken-over"])
def test_a_snapshot_writes_its_marks_after_its_states_under_the_same_guard(held: bool
                                                                           ) -> None:
    store, ledger, fence = DictStore(), Ledger(), EpochFence()
    fence.assign(store.take_epochs([A]))
    if not held:
        store.take_epochs([A])  # another worker took the partition over
    mark = LogMark(4, 9, "x")
    ledger.assigned({A: 0})
    ledger.processed({A: 5}, sent=False, marks={A: mark})
    checkpoint = ledger.take(dirty=True)
    assert checkpoint is not None
    writer = StoreWriter(stores={"mem": store}, stats_store=None, fence=fence)
    snapshot = Snapshot([StageRows("totals", "mem", {"k": b"v"}, {})], checkpoint)
    if held:
        writer.write(snapshot)
    else:
        with pytest.raises(Fenced):  # DictStore's refusal, as Redis's script's
            writer.write(snapshot)
    if held:
        assert store.saved == ["totals", LOGS_STAGE]
        assert store.rows[(LOGS_STAGE, "orders|0")] == mark.encode()
        assert store.guards == [{A: 1}, {A: 1}]
    else:
        assert (LOGS_STAGE, "orders|0") not in store.rows


class OffsetsOnly:
    """A consumer as ``_out_of_range`` uses it: ListOffsets answers only."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, self.end)

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, self.start)


def test_an_offset_a_real_broker_refuses_is_judged_by_the_log_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real Kafka answers a fetch outside the log with OFFSET_OUT_OF_RANGE (Tansu with an
    empty fetch, tested in the integration test): below the mark's offset at the end is
    refused; gone at the start (retention) while the log goes on is accepted, warned."""


    check = LogCheck(DictStore(), {}, 5)
    tp, mark = KafkaPartition("orders", 0), LogMark(41, 1, "d")
    with pytest.raises(LogReplaced, match=r"up to offset 41, and it now ends at offset 12"):
        asyncio.run(check._out_of_range(OffsetsOnly(0, 12), tp, mark))  # type: ignore[arg-type]
    asyncio.run(check._out_of_range(OffsetsOnly(100, 500), tp, mark))  # type: ignore[arg-type]
    assert "cannot tell whether the topic was re-created" in caplog.text


def test_a_republisher_says_its_readers_need_no_forget_of_their_own() -> None:
    republisher = (Pipeline("norm", topics=("raw",)).map("m", str)
                   .republish("out", "normalized").republish("copy", "audit"))
    note = downstream_note(republisher.republished_to, "raw")
    assert "republishes to audit, normalized" in note
    assert "next generation" in note and "without a forget of their own" in note
    refused = LogReplaced(("raw", 0), LogMark(4, 1, "d"), "it now ends at offset 0", note)
    assert str(refused).endswith(note)
    assert downstream_note(Pipeline("sum", topics=("raw",)).map("m", str).republished_to,
                           "raw") == ""


def test_a_forget_drops_the_topics_marks_and_counts_its_generations_up() -> None:
    """Only partitions of the topic that hold a mark; a generation row counts on from its
    value; the other topic's rows and the rows already forgotten are left."""
    rows = {"raw|0": LogMark(9, 1, "d").encode(), "raw|0|generation": b"2",
            "raw|1": LogMark(4, 1, "e").encode(), "raw|2": NO_MARK,
            "rawer|0": LogMark(3, 1, "f").encode()}
    assert forgotten_rows(rows, "raw") == {"raw|0": NO_MARK, "raw|0|generation": b"3",
                                           "raw|1": NO_MARK, "raw|1|generation": b"1"}
    assert forgotten_rows(rows, "other") == {}


def test_the_check_answers_the_generations_of_forgotten_logs() -> None:
    """No mark left (just forgotten): nothing to fetch, the generations answered."""
    store = DictStore()
    store.save(LOGS_STAGE, {"raw|0": NO_MARK, "raw|0|generation": b"2", "raw|1": NO_MARK})
    found = asyncio.run(LogCheck(store, {}, 5).verify(
        {KafkaPartition("raw", 0), KafkaPartition("raw", 1)}))
    assert found.generations == {("raw", 0): 2} and found.marks == {}
