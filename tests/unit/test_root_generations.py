"""A root log forgotten and counted again: its republished roots continue above the old log's.

``onceflow forget --topic T`` on the pipeline reading ``T`` counts the log's
generation up (``log_marks.forgotten_rows``); its republish steps then write
``T``'s roots at ``lineage.root_offset(generation, offset)``, so a pipeline
reading the outputs, whose watermarks hold the old log's positions, takes the
new log's records as new without a forget of its own; an exclusive output's
tail scan reads the old generation's outputs as older than anything new.
Pure logic; the real delete and create: tests/integration/test_recreated_stateless.py.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from test_exclusive_outputs import item, mirror, runner, scan

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages import Pipeline
from onceflow.stages.lineage import GENERATION_BITS, root_offset, split_root_offset
from onceflow.stages.outcome import Output
from onceflow.stages.tail_scan import written_origin
from onceflow.testing import Record, TestRun

NEW = 1 << GENERATION_BITS  # generation 1's offset 0


@given(st.integers(0, 2**23 - 1), st.integers(0, 2**GENERATION_BITS - 1))
def test_a_root_offset_keeps_its_generation_and_offset_apart(generation: int, offset: int
                                                               ) -> None:
    written = root_offset(generation, offset)
    assert split_root_offset(written) == (generation, offset)
    assert written < 2**63  # an int64 of the envelope
    assert root_offset(generation + 1, 0) > written  # a new log starts above the old one


def roots(outputs: list[Output]) -> list[int]:
    return [Envelope.FromString(o.value).source_chain[0].offset for o in outputs]


def test_a_root_record_is_republished_in_its_logs_generation_and_a_chained_one_as_it_was(
) -> None:
    r = runner(mirror())
    r.assigned([("in", 0)], {("in", 0): 1})
    assert roots(r.process([item(0, 3, 2)]).outputs) == [NEW + 3, NEW + 3]
    r.assigned([("in", 0)])  # a later assignment without it: generation 0 again
    assert roots(r.process([item(0, 4, 1)]).outputs) == [4]
    plain = runner(mirror(format="json"))
    plain.assigned([("in", 0)], {("in", 0): 2})
    out = plain.process([item(0, 7, 1)]).outputs[0]
    assert dict(out.headers)["onceflow-chain"] == f"in/0/{2 * NEW + 7}/0".encode()
    assert written_origin(out.value, out.headers, {("in", 0): 2}) == (("in", 0), (7, 0))


def test_an_exclusive_output_resumes_within_the_new_log_past_the_old_logs_outputs() -> None:
    """The old log wrote outputs for offsets 0..5; the new one (generation 1) wrote its
    first three records' outputs, then the worker died uncommitted: the scan skips what
    the new log wrote, finds the old log's outputs older than all of it, and the replay
    writes every other output of the new log once."""
    old = runner(mirror()).process([item(0, o, 2) for o in range(6)]).outputs
    new_records = [item(0, o, 2) for o in range(4)]
    first = runner(mirror())
    first.assigned([("in", 0)], {("in", 0): 1})
    new = first.process(new_records).outputs
    log = old + new[:5]  # the third record's second output never reached the broker
    successor = runner(mirror())
    successor.assigned([("in", 0)], {("in", 0): 1})
    tail = scan(log, {("in", 0): 0}, chunk=3, generations={("in", 0): 1})[0]
    assert tail == {("in", 0): (2, 0)}
    successor.written.resume("out", tail, [("in", 0)])
    assert log + successor.process(new_records).outputs == old + new
    # Read in generation 0, the old log's outputs are the ones written (up to (5, 1)).
    assert scan(old, {("in", 0): 0}, chunk=3)[0] == {("in", 0): (5, 1)}


def test_a_reader_downstream_counts_the_new_logs_records_and_still_drops_copies() -> None:
    """The reader folded the old log's outputs (roots 0..4); the new log's outputs at the
    same offsets are counted, and a copy of one re-sent is dropped."""
    count = (Pipeline("d", topics=("out",), format="json")
             .aggregate("n", key=lambda v: "all", init=lambda: 0, fold=lambda n, _: n + 1))
    reader = TestRun(count)

    def plain(outputs: list[Output]) -> list[Record]:
        return [Record(json.loads(o.value), headers=list(o.headers)) for o in outputs]

    reader.feed(plain(runner(mirror(format="json")).process(
        [item(0, o, 1) for o in range(5)]).outputs))
    relay = runner(mirror(format="json"))
    relay.assigned([("in", 0)], {("in", 0): 1})
    new = plain(relay.process([item(0, o, 1) for o in range(3)]).outputs)
    reader.feed([*new, new[1]])
    assert reader.states("n") == {"all": 8}
    assert reader.counters["n.duplicates"] == 1
    assert reader.watermarks("n", "all") == {("in", 0): (NEW + 2, 0)}
