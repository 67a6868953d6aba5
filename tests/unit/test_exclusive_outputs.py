"""Exclusive republish: the tail scan, the resume of a replay, plain outputs' headers.

Pure logic only (the Kafka reading is in tests/integration and tests/e2e).
``scan`` below drives ``TailScan`` over a log the way
``onceflow.kafka.tail_reader.TailReader`` does: chunks from the end backwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runner import Rec

from onceflow.kafka.outbox_rows import decode_record, encode_record
from onceflow.protos.envelope_pb2 import SourceRef
from onceflow.runtime.config import ConfigError, load_settings
from onceflow.runtime.wiring import check_exclusive
from onceflow.stages import Pipeline
from onceflow.stages.origin import plain_headers
from onceflow.stages.outcome import Output
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import TopicPartition
from onceflow.stages.tail_scan import TailScan, Written, merge, windows, written_origin
from onceflow.testing import Record, TestRun


def mirror(partition: Callable[[str, int], int] | None = None, format: str = "envelope"
           ) -> Pipeline:
    """Each JSON item {"id", "parts"} fans out to its parts, republished exclusively."""
    return (Pipeline("m", topics=("in",), format="json")
            .flat_map("parts", lambda item: [[item["id"], j] for j in range(item["parts"])])
            .republish("out", "out", exclusive=True, partition=partition, format=format))


def runner(pipeline: Pipeline) -> PipelineRunner:
    return PipelineRunner(pipeline, lambda spec, keys: {}, "dead")


def item(partition: int, offset: int, parts: int) -> Rec:
    return Rec("in", partition, offset, json.dumps({"id": f"{partition}:{offset}",
                                                    "parts": parts}).encode())


def scan(log: Sequence[Output], committed: dict[TopicPartition, int], chunk: int,
         pending: Sequence[Output] = (), generations: dict[TopicPartition, int] | None = None,
         ) -> tuple[Written, int]:
    """What the tail reader finds in ``log`` (one output partition), and records read
    (``generations``: of the root logs, as the tail reader gets them)."""
    tail = TailScan(committed, partial(written_origin, generations=generations))
    tail.feed((o.value, o.headers) for o in pending)
    read = 0
    for start, end in windows(0, len(log), chunk):
        if tail.done:
            break
        tail.feed((o.value, o.headers) for o in log[start:end])
        read += end - start
    return tail.written, read


def origins(outputs: Iterable[Output]) -> list[tuple[TopicPartition, tuple[int, ...]] | None]:
    return [written_origin(o.value, o.headers) for o in outputs]


def test_an_empty_partition_resumes_nothing_and_writes_everything() -> None:
    written, read = scan([], {("in", 0): 0}, chunk=10)
    assert (written, read) == ({}, 0)
    r = runner(mirror())
    r.written.resume("out", written, [("in", 0)])
    outputs = r.process([item(0, 0, 2), item(0, 1, 1)]).outputs
    assert origins(outputs) == [(("in", 0), (0, 0)), (("in", 0), (0, 1)), (("in", 0), (1, 0))]
    assert {o.partition for o in outputs} == {0}


def test_a_tail_of_other_roots_only_is_read_to_the_start_and_finds_nothing() -> None:
    other = runner(mirror(lambda topic, partition: 0)).process(
        [item(1, o, 1) for o in range(25)]).outputs
    foreign = [Output("out", None, b'{"not": "onceflow"}')] * 5
    written, read = scan([*foreign, *other], {("in", 0): 3}, chunk=7)
    assert written == {} and read == 30


def test_a_fan_out_cut_in_the_middle_of_one_input_resumes_at_the_next_index() -> None:
    records = [item(0, 0, 3), item(0, 1, 4), item(0, 2, 2)]
    full = runner(mirror()).process(records).outputs
    log = full[:5]  # input 1 wrote parts 0 and 1 of 4, then the worker died
    written, _ = scan(log, {("in", 0): 0}, chunk=2)
    assert written == {("in", 0): (1, 1)}
    successor = runner(mirror())
    successor.written.resume("out", written, [("in", 0)])
    rest = successor.process(records).outputs  # the replay from the commit (0)
    assert origins(rest) == [(("in", 0), (1, 2)), (("in", 0), (1, 3)),
                             (("in", 0), (2, 0)), (("in", 0), (2, 1))]
    assert log + rest == full


def test_several_roots_interleaved_each_resume_at_their_own_position() -> None:
    both = mirror(lambda topic, partition: 0)
    records = [item(0, 0, 2), item(1, 0, 3), item(0, 1, 1), item(1, 1, 2), item(0, 2, 2)]
    full = runner(both).process(records).outputs
    log = full[:7]  # 0:0 x2, 1:0 x3, 0:1 x1, 1:1 part 0
    written, _ = scan(log, {("in", 0): 0, ("in", 1): 0}, chunk=3)
    assert written == {("in", 0): (1, 0), ("in", 1): (1, 0)}
    successor = runner(both)
    successor.written.resume("out", written, [("in", 0), ("in", 1)])
    assert log + successor.process(records).outputs == full


def test_the_scan_stops_below_the_committed_offset_of_every_input_mapped_there() -> None:
    both = mirror(lambda topic, partition: 0)
    records = [item(p, o, 1) for o in range(100) for p in (0, 1)]  # 200 outputs, alternating
    log = runner(both).process(records).outputs
    written, read = scan(log, {("in", 0): 90, ("in", 1): 95}, chunk=10)
    assert written == {("in", 0): (99, 0), ("in", 1): (99, 0)}
    assert read == 30  # offsets 90..99 of both in two chunks, then one reaching below 90
    # An input partition not fed lately: read back until its newest output.
    records = [item(0, o, 1) for o in range(50)] + [item(1, o, 1) for o in range(100)]
    log = runner(both).process(records).outputs
    assert scan(log, {("in", 0): 50, ("in", 1): 100}, chunk=10) == (
        {("in", 0): (49, 0), ("in", 1): (99, 0)}, 110)


def test_records_still_pending_in_the_producer_count_as_written() -> None:
    records = [item(0, o, 2) for o in range(5)]
    full = runner(mirror()).process(records).outputs
    written, _ = scan(full[:4], {("in", 0): 0}, chunk=3, pending=full[4:7])
    assert written == {("in", 0): (3, 0)}
    successor = runner(mirror())
    successor.written.resume("out", written, [("in", 0)])
    assert full[:7] + successor.process(records).outputs == full


def test_a_mark_is_forgotten_once_the_replay_passes_it_and_a_new_scan_replaces_it() -> None:
    r = runner(mirror())
    r.written.resume("out", {("in", 0): (1, 0)}, [("in", 0)])
    assert r.process([item(0, 1, 2)]).outputs and len(r.written) == 1
    r.process([item(0, 2, 1)])
    assert len(r.written) == 0
    r.written.resume("out", {("in", 0): (5, 0)}, [("in", 0)])
    r.written.resume("out", {}, [("in", 0)])  # the partition came back, nothing written
    assert len(r.written) == 0


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4)), min_size=1, max_size=40),
    cut=st.floats(0, 1), pending=st.floats(0, 1),
    commit=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    chunk=st.integers(1, 9), order=st.randoms(use_true_random=False),
)
def test_any_crash_then_resume_leaves_each_output_once_in_order(
    parts: list[tuple[int, int]], cut: float, pending: float, commit: tuple[float, float],
    chunk: int, order: Any,
) -> None:
    """Two input partitions into one output partition; the worker dies after any
    number of outputs (some still pending in its producer), each input partition
    committed anywhere at or below its first input not fully written; the
    successor scans, replays from the commits in any interleaving, and the
    output holds, per input partition, exactly its outputs in order."""
    both = mirror(lambda topic, partition: 0)
    offsets = {0: 0, 1: 0}
    records = []
    for partition, n in parts:
        records.append(item(partition, offsets[partition], n))
        offsets[partition] += 1
    full = runner(both).process(records).outputs
    sent = round(cut * len(full))
    in_broker = sent - round(pending * sent)
    committed = {}
    for p in (0, 1):
        mine = [r for r in records if r.partition == p]
        first_open = next((r.offset for r in mine if not _all_written(r, full, sent)), len(mine))
        committed[("in", p)] = int(commit[p] * first_open)
    written, _ = scan(full[:in_broker], committed, chunk, pending=full[in_broker:sent])
    successor = runner(both)
    successor.written.resume("out", written, committed)
    replay = [r for r in records if r.offset >= committed[("in", r.partition)]]
    queues = {p: [r for r in replay if r.partition == p] for p in (0, 1)}
    log = list(full[:sent])
    while queues[0] or queues[1]:
        p = order.choice([p for p in (0, 1) if queues[p]])
        log += successor.process([queues[p].pop(0)]).outputs
    for p in (0, 1):
        assert [o for o in origins(log) if o and o[0] == ("in", p)] == \
               [o for o in origins(full) if o and o[0] == ("in", p)]


def _all_written(record: Rec, full: Sequence[Output], sent: int) -> bool:
    """Every output of ``record`` is among the first ``sent``."""
    mine = [i for i, o in enumerate(origins(full))
            if o and o[0] == ("in", record.partition) and o[1][0] == record.offset]
    return all(i < sent for i in mine)


def test_plain_outputs_carry_the_origin_and_a_onceflow_reader_roots_them_at_the_chain() -> None:
    outputs = runner(mirror(format="json")).process([item(0, 7, 2)]).outputs
    assert [json.loads(o.value) for o in outputs] == [["0:7", 0], ["0:7", 1]]
    headers = dict(outputs[1].headers)
    assert headers["onceflow-format"] == b"json"
    assert (headers["onceflow-origin-topic"], headers["onceflow-origin-partition"],
            headers["onceflow-origin-offset"], headers["onceflow-origin-index"]) == \
        (b"in", b"0", b"7", b"1")
    assert headers["onceflow-chain"] == b"in/0/7/1"
    assert written_origin(outputs[1].value, outputs[1].headers) == (("in", 0), (7, 1))
    # Downstream: the plain topic read as JSON; a re-sent copy at another offset is a
    # duplicate of the same root position, so it is counted once.
    count = (Pipeline("d", topics=("out",), format="json")
             .aggregate("n", key=lambda v: str(v[0]), init=lambda: 0, fold=lambda n, _: n + 1))
    run = TestRun(count)
    plain = [Record(json.loads(o.value), headers=list(o.headers)) for o in outputs]
    run.feed([*plain, plain[1]])
    assert run.states("n") == {"0:7": 2}
    assert run.counters["n.duplicates"] == 1
    assert run.watermarks("n", "0:7") == {("in", 0): (7, 1)}


def test_the_plain_chain_extends_through_a_second_hop() -> None:
    chain = [SourceRef(topic="a", partition=2, offset=5, index=1)]
    record = Rec("in", 0, 3, b'{"id": "x", "parts": 1}',
                 headers=plain_headers(chain, "a/2/5.1", 1000))
    outputs = runner(mirror()).process([record]).outputs
    # (input offset, the input's own last index, output index): see written_origin
    assert written_origin(outputs[0].value, outputs[0].headers) == (("in", 0), (3, 1, 0))
    from onceflow.protos.envelope_pb2 import Envelope
    env = Envelope.FromString(outputs[0].value)
    assert [(r.topic, r.partition, r.offset, r.index) for r in env.source_chain] == \
        [("a", 2, 5, 1), ("in", 0, 3, 0)]
    assert env.event_id == "a/2/5.1.0" and env.event_time_ms == 1000


def test_chunks_go_backwards_and_cover_the_range() -> None:
    assert list(windows(0, 7, 3)) == [(4, 7), (1, 4), (0, 1)]
    assert list(windows(5, 5, 3)) == []
    with pytest.raises(ValueError):
        list(windows(0, 5, 0))
    assert merge({("a", 0): (3, 1)}, {("a", 0): (3, 2), ("a", 1): (0, 0)}) == \
        {("a", 0): (3, 2), ("a", 1): (0, 0)}


def test_the_outbox_keeps_an_output_partition() -> None:
    out = Output("t", b"k", b"v", (("h", b"1"),), 3)
    assert decode_record(encode_record(out)) == out
    assert decode_record(encode_record(Output("t", None, b"v"))).partition is None


@pytest.mark.parametrize("build, message", [
    (lambda p: p.republish("r", "o", exclusive=True, partition="key"),
     "needs each output partition to be a function of the input partition"),
    (lambda p: p.republish("r", "o", exclusive=True, partition=lambda value: 0),
     "function of the input (topic, partition) only"),
    (lambda p: p.republish("r", "o", format="avro"), "format 'avro'"),
    (lambda p: p.republish("r", "o", exclusive=True).republish("s", "o"), "written by no other"),
    (lambda p: p.republish("r", "in", exclusive=True), "read by none"),
])
def test_exclusive_steps_are_refused_when_they_cannot_be_one_writer(
    build: Callable[[Pipeline], Pipeline], message: str,
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build(Pipeline("p", topics=("in",)))


def test_a_partition_map_that_is_no_function_of_the_input_partition_stops_the_worker(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.conf"
    path.write_text('onceflow.pipeline = "onceflow.examples.mirror:mirror"\n')
    config = load_settings(path)
    calls = iter(range(1000))
    for partition_map, answer in ((lambda t, p: next(calls), "answered 0, then 1"),
                                  (lambda t, p: p - 1, "answered -1"),
                                  (lambda t, p: 1 // 0, "raised ZeroDivisionError")):
        pipeline = Pipeline("p", topics=("in",)).republish("r", "o", exclusive=True,
                                                            partition=partition_map)
        with pytest.raises(ConfigError, match=answer):
            check_exclusive(config, pipeline)
    check_exclusive(config, Pipeline("p", topics=("in",)).republish("r", "o", exclusive=True))


def test_a_plain_output_read_as_envelopes_is_dead_lettered_naming_its_format() -> None:
    outputs = runner(mirror(format="json")).process([item(0, 0, 1)]).outputs
    reader = runner(Pipeline("e", topics=("out",)).map("m", lambda e: e))
    plain = Rec("out", 0, 0, outputs[0].value, headers=outputs[0].headers)
    dead = reader.process([plain]).outputs[0]
    assert "it has the onceflow-format=json header" in dict(dead.headers)[
        "onceflow.reason"].decode()
