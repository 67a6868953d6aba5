"""Producer-sequence dedup: the sequence rules, the stored row, the write order, and
exactness under crashes and replays (TestRun runs the worker's runner)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow import Pipeline, ProducerDedup
from onceflow.actors.messages import StageRows
from onceflow.actors.pipeline_actor import snapshot_rows
from onceflow.checkpoint.persistence import write_order
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, PartitionSequences
from onceflow.testing import Record, TestRun

IDLE = 1_000_000


def admit(table: PartitionSequences, producer: str, seq: int, epoch: int = 0,
          offset: int = 0, idle: int = IDLE) -> bool:
    return table.admit(producer, epoch, seq, offset, idle)


def test_gap_accepted_equal_and_lower_dropped() -> None:
    table = PartitionSequences()
    assert admit(table, "a", 1)
    assert admit(table, "a", 5)  # a gap is fine
    assert not admit(table, "a", 5)
    assert not admit(table, "a", 3)
    assert admit(table, "a", 6)
    assert table.duplicates == 2


def test_new_producer_accepted_whatever_its_sequence() -> None:
    table = PartitionSequences()
    assert admit(table, "a", 100)
    assert admit(table, "b", 1)
    assert admit(table, "c", 0)


def test_epochs_higher_resets_lower_is_stale() -> None:
    table = PartitionSequences()
    assert admit(table, "a", 50, epoch=1)
    assert admit(table, "a", 0, epoch=2)  # restarted numbering
    assert admit(table, "a", 1, epoch=2)
    assert not admit(table, "a", 60, epoch=1)  # the old incarnation
    assert not admit(table, "a", 1, epoch=2)


def test_two_partitions_of_one_producer_are_independent() -> None:
    pipeline = _pipeline()
    run = TestRun(pipeline, partitions=2)
    run.feed([_report("a", 1, 10, partition=0), _report("a", 1, 20, partition=1),
              _report("a", 2, 30, partition=1), _report("a", 1, 40, partition=0)])
    assert run.states("total") == {"d": 60}
    assert run.counters["source.producer_duplicates"] == 1


def test_idle_producers_are_forgotten_by_positions_in_their_partition() -> None:
    table = PartitionSequences()
    assert admit(table, "a", 5, offset=1_000, idle=100)
    assert admit(table, "b", 1, offset=1_050, idle=100)
    assert not admit(table, "a", 5, offset=1_090, idle=100)  # 90 records later: known
    assert admit(table, "a", 5, offset=1_191, idle=100)  # 101 after its last: forgotten
    assert admit(table, "b", 2, offset=1_250, idle=100)
    table.next_offset = 1_251
    table.expire(100)
    assert set(table.producers) == {"a", "b"}  # both seen within the last 100 offsets
    assert admit(table, "c", 1, offset=2_000, idle=100)
    table.next_offset = 2_001
    table.expire(100)
    assert set(table.producers) == {"c"}


def test_row_round_trip() -> None:
    table = PartitionSequences(next_offset=7)
    admit(table, "dev-1", 4, epoch=2, offset=5)
    admit(table, "dev-1", 4, epoch=2, offset=6)
    back = PartitionSequences.decode(table.encode())
    assert back == table
    assert json.loads(table.encode())["producers"] == {"dev-1": [2, 4, 6]}


def test_a_row_of_the_timestamp_rule_loads_every_producer_as_seen_at_its_offset() -> None:
    """Rows written before idle expiry went by positions hold timestamps: each producer
    is kept as if last seen at the row's last offset (never forgotten sooner)."""
    old = json.dumps({"next": 40, "newest": 1_700_000_000_000, "dups": 3,
                      "producers": {"a": [1, 9, 1_600_000_000_000], "b": [0, 2, 5]}}).encode()
    table = PartitionSequences.decode(old)
    assert (table.next_offset, table.duplicates) == (40, 3)
    assert table.producers == {"a": [1, 9, 39], "b": [0, 2, 39]}
    assert not admit(table, "a", 9, epoch=1, offset=40, idle=10)  # a re-send: still known
    assert PartitionSequences.decode(table.encode()) == table


def test_sequence_rows_are_written_last_in_a_snapshot() -> None:
    pipeline = (Pipeline("p", topics=("in",), format="json",
                         dedup=ProducerDedup(producer="pid", sequence="seq"))
                .aggregate("first", key=lambda v: v["d"], init=lambda: 0,
                           fold=lambda s, v: s + v["n"])
                .aggregate("second", key=lambda v: v["d"], init=lambda: 0,
                           fold=lambda s, _: s + 1))
    run = TestRun(pipeline)
    run.feed([_report("a", 1, 1)])
    rows: list[StageRows] = snapshot_rows(run.runner, pipeline.dedup_store, 1)
    assert [r.stage_id for r in write_order(rows)] == ["second", "first", SEQUENCE_STAGE]


def test_records_below_a_durable_row_are_skipped_whole_and_counted() -> None:
    """After a crash the records the written row covers are replays: skipped before any
    step (the re-send among them not counted again), the rest classified as before."""
    run = TestRun(_pipeline(), partitions=2, batch_size=3)
    run.feed([_report("a", 1, 1), _report("a", 2, 10), _report("a", 2, 10),
              _report("b", 1, 100, partition=1)])
    run.persist()  # rows cover all four; nothing committed
    run.feed([_report("a", 3, 1000), _report("b", 1, 100, partition=1)])
    run.crash()  # replays all six: four skipped whole
    assert run.states("total") == {"d": 1111}
    assert run.counters["source.duplicates"] == 4
    run.persist()
    assert run.producer_duplicates == 2


def test_missing_sequence_is_a_dead_letter_and_the_run_goes_on() -> None:
    run = TestRun(_pipeline())
    run.feed([Record({"d": "d", "n": 1}, headers=[("pid", b"a")]), _report("a", 1, 2)])
    assert run.states("total") == {"d": 2}
    assert "no sequence header 'seq'" in run.dead_letters[0].reason


def test_a_stateless_republisher_drops_re_sends() -> None:
    pipeline = Pipeline("r", topics=("in",), format="json", dedup=ProducerDedup(
        producer="pid", sequence=lambda v: v["s"], store="redis")).republish(
        "out", "out", encode=lambda v: json.dumps(v).encode())
    run = TestRun(pipeline)
    run.feed([Record({"s": 1}, headers=[("pid", b"a")]), Record({"s": 2}, headers=[("pid", b"a")]),
              Record({"s": 1}, headers=[("pid", b"a")])])
    assert [json.loads(p.envelope.payload)["s"] for p in run.outputs("out")] == [1, 2]


def test_dedup_without_any_store_is_refused() -> None:
    stateless = Pipeline("r", topics=("in",), dedup=ProducerDedup(producer="pid", sequence="seq"))
    with pytest.raises(ValueError, match="needs a store"):
        TestRun(stateless)


def test_partitions_with_records_without_a_key_are_named_for_a_warning() -> None:
    # A re-send without a key may land on another partition, where no table has its
    # original: the worker warns about the partitions where such records arrive.
    run = TestRun(_pipeline(), partitions=3)
    keyed = _report("a", 1, 10, partition=1)
    run.feed([Record(keyed.value, partition=1, key="a", headers=keyed.headers),
              _report("b", 1, 20, partition=2)])
    assert run.runner.sequences is not None
    assert run.runner.sequences.unkeyed() == [("in", 2)]
    assert run.states("total") == {"d": 30}  # only named: both folded as before


def _pipeline() -> Pipeline:
    return (Pipeline("sums", topics=("in",), format="json",
                     dedup=ProducerDedup(producer="pid", sequence="seq"))
            .aggregate("total", key=lambda v: v["d"], init=lambda: 0,
                       fold=lambda s, v: s + v["n"]))


def _report(producer: str, seq: int, n: int, partition: int = 0, device: str = "d",
            ts: int | None = None) -> Record:
    return Record({"d": device, "n": n}, partition=partition, timestamp=ts,
                  headers=[("pid", producer.encode()), ("seq", str(seq).encode())])


@st.composite
def streams(draw: Any) -> tuple[list[tuple[str, int, int, int]], list[tuple[str, int]]]:
    """Events (producer, seq, partition, amount) with some re-sent later, and the actions."""
    events = []
    for producer in ("p", "q", "r"):
        partition = draw(st.integers(0, 1))
        for seq in range(draw(st.integers(1, 12))):
            if draw(st.booleans()):  # gaps
                events.append((producer, seq * 2, partition, draw(st.integers(1, 9))))
    order = draw(st.permutations(events))
    per_producer: dict[str, list[tuple[str, int, int, int]]] = {}
    for event in order:  # a producer's own events stay in sequence order
        per_producer.setdefault(event[0], []).append(event)
    for sent in per_producer.values():
        sent.sort(key=lambda e: e[1])
    stream: list[tuple[str, int, int, int]] = []
    cursors = dict.fromkeys(per_producer, 0)
    for event in order:
        producer = event[0]
        stream.append(per_producer[producer][cursors[producer]])
        cursors[producer] += 1
        if stream and draw(st.integers(0, 4)) == 0:  # a re-send of one already sent
            stream.append(draw(st.sampled_from([e for e in stream if e[0] == producer])))
    actions = draw(st.lists(st.tuples(st.sampled_from(["commit", "persist", "crash",
                                                        "crash-mid-persist"]),
                                      st.integers(0, max(len(stream) - 1, 0))), max_size=6))
    return stream, actions


@settings(max_examples=150, deadline=None)
@given(streams(), st.integers(1, 4))
def test_crashes_and_replays_admit_each_distinct_event_once(
        generated: tuple[list[tuple[str, int, int, int]], list[tuple[str, int]]],
        batch: int) -> None:
    stream, actions = generated
    run = TestRun(_pipeline(), partitions=2, batch_size=batch)
    at: dict[int, list[str]] = {}
    for action, index in actions:
        at.setdefault(index, []).append(action)
    for index, (producer, seq, partition, n) in enumerate(stream):
        run.feed([_report(producer, seq, n, partition=partition, device=producer,
                          ts=1_000 + index)])
        for action in at.get(index, []):
            if action == "commit":
                run.commit()
            elif action == "persist":
                run.persist()
            else:
                run.crash(mid_persist=action == "crash-mid-persist")
    distinct = {(p, s, part): n for p, s, part, n in stream}
    expected: dict[str, int] = {}
    for (producer, _, _), n in distinct.items():
        expected[producer] = expected.get(producer, 0) + n
    assert run.states("total") == expected
    run.commit()
    run.crash()  # the durable rows count every re-send exactly once
    assert run.producer_duplicates == len(stream) - len(distinct)
