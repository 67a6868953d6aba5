"""Dead letters and late events written once: placement, the tail scan of a shared
dead-letter partition, the replay that skips what is already written.

Pure logic only (the Kafka side: tests/e2e/test_hostile_records_under_sigkill.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest
from test_runner import Rec, envelope
from test_windows import MINUTE, windowed

from onceflow.kafka.tail_reader import ExclusiveResume, resumed_outputs
from onceflow.stages import Pipeline
from onceflow.stages.outcome import Output
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.side_outputs import SideOrigin, late_value, side_partition
from onceflow.stages.state import TopicPartition
from onceflow.stages.tail_scan import TailScan, Written, windows


def counting() -> Pipeline:
    """JSON {"k": key}; a value that is not an object fails the key function."""
    return (Pipeline("p", topics=("in", "other"), format="json")
            .aggregate("n", key=lambda v: v["k"], init=lambda: 0, fold=lambda s, _: s + 1))


def runner(pipeline: Pipeline, dead_partitions: int | None = 3) -> PipelineRunner:
    r = PipelineRunner(pipeline, lambda spec, keys: {}, "dead", "late")
    if dead_partitions is not None:
        r.side.partitions["dead"] = r.side.partitions["late"] = dead_partitions
    return r


def good(topic: str, partition: int, offset: int) -> Rec:
    return Rec(topic, partition, offset, json.dumps({"k": f"{partition}"}).encode())


def bad(topic: str, partition: int, offset: int) -> Rec:
    return Rec(topic, partition, offset, b"not json")


def scan(log: Sequence[Output], committed: dict[TopicPartition, int], pipeline_id: str = "p",
         chunk: int = 2, generations: dict[TopicPartition, int] | None = None
         ) -> tuple[Written, int]:
    """What the tail reader finds in ``log`` (one dead-letter partition), records read."""
    origin = SideOrigin(pipeline_id)
    tail = TailScan(committed, lambda value, headers: origin(value, headers, generations))
    read = 0
    for start, end in windows(0, len(log), chunk):
        if tail.done:
            break
        tail.feed((o.value, o.headers) for o in log[start:end])
        read += end - start
    return tail.written, read


def test_input_partitions_map_to_dead_letter_partitions_mod_their_count() -> None:
    assert [side_partition(p, 3) for p in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    r = runner(counting())
    letters = r.process([bad("in", p, 10) for p in range(5)] + [bad("other", 4, 0)]).outputs
    assert [(o.topic, o.partition) for o in letters] == \
        [("dead", 0), ("dead", 1), ("dead", 2), ("dead", 0), ("dead", 1), ("dead", 1)]


def test_without_a_known_partition_count_the_producer_picks_as_before() -> None:
    (letter,) = runner(counting(), dead_partitions=None).process([bad("in", 1, 0)]).outputs
    assert letter.partition is None


def test_the_origin_is_the_pipeline_and_source_headers_other_pipelines_are_read_past() -> None:
    (letter,) = runner(counting()).process([bad("in", 4, 17)]).outputs
    assert SideOrigin("p")(letter.value, letter.headers) == (("in", 4), (17, 0))
    assert SideOrigin("q")(letter.value, letter.headers) is None
    assert SideOrigin("p")(b"", [("onceflow.pipeline", b"p"), ("onceflow.source", b"x")]) \
        is None
    assert SideOrigin("p")(b"", None) is None


def test_several_input_partitions_share_a_dead_letter_partition_each_resumes_its_own() -> None:
    r = runner(counting(), dead_partitions=2)
    batch = [bad("in", 0, 0), bad("in", 2, 0), good("in", 0, 1), bad("in", 2, 1),
             bad("in", 0, 2), bad("other", 0, 5), bad("in", 2, 2)]
    log = [o for o in r.process(batch).outputs if o.partition == 0]
    assert len(log) == 6
    other = runner(Pipeline("q", topics=("in",), format="json")).process([bad("in", 0, 9)])
    log += other.outputs  # another pipeline sharing the topic, written last
    committed = {("in", 0): 3, ("in", 2): 2, ("other", 0): 6}
    written, read = scan(log, committed)
    assert written == {("in", 0): (2, 0), ("in", 2): (2, 0), ("other", 0): (5, 0)}
    assert read == 6  # each ends at its first record below its commit: in/2 at 1
    written, read = scan(log, {("in", 0): 0})  # nothing below the commit: to the start
    assert (written, read) == ({("in", 0): (2, 0)}, 7)


def test_a_replay_skips_the_dead_letters_already_written_and_writes_the_rest() -> None:
    first = runner(counting())
    batch = [bad("in", 1, 0), good("in", 1, 1), bad("in", 1, 2), bad("in", 1, 3)]
    written_before_the_kill = first.process(batch).outputs[:2]  # the third never reached it
    written, _ = scan(written_before_the_kill, {("in", 1): 1})
    assert written == {("in", 1): (2, 0)}
    replay = runner(counting())
    replay.written.resume("dead", written, [("in", 1)])
    outcome = replay.process(batch[1:])  # from the committed offset 1
    assert [o.headers[2] for o in outcome.outputs] == [("onceflow.source", b"in/1/3")]
    assert outcome.dead_letters == 1
    assert outcome.stats(3)["side_outputs_skipped"] == 1
    later = replay.process([bad("in", 1, 4)]).outputs  # past the mark: written again
    assert [o.headers[2] for o in later] == [("onceflow.source", b"in/1/4")]


def test_a_forgotten_logs_dead_letters_are_older_than_all_of_the_new_log() -> None:
    """``onceflow forget --topic in`` made the new log generation 1: its bad records at
    the old log's offsets are dead-lettered too (the old letters read as older than any
    of it), and a replay of the new log still skips the letters of the new log."""
    old = runner(counting()).process([bad("in", 1, 0), bad("in", 1, 1)]).outputs
    assert scan(old, {("in", 1): 0})[0] == {("in", 1): (1, 0)}  # generation 0: as before
    first = runner(counting())
    first.assigned([("in", 1)], {("in", 1): 1})
    new = first.process([bad("in", 1, 0), good("in", 1, 1), bad("in", 1, 2)]).outputs
    assert [dict(o.headers)["onceflow.generation"] for o in new] == [b"1", b"1"]
    log = [*old, new[0]]  # the new log's second letter never reached the broker
    written, _ = scan(log, {("in", 1): 0}, generations={("in", 1): 1})
    assert written == {("in", 1): (0, 0)}
    replay = runner(counting())
    replay.assigned([("in", 1)], {("in", 1): 1})
    replay.written.resume("dead", written, [("in", 1)])
    again = replay.process([bad("in", 1, 0), good("in", 1, 1), bad("in", 1, 2)]).outputs
    assert [dict(o.headers)["onceflow.source"] for o in again] == [b"in/1/2"]
    # read without the generation (the bug): the old letters hide the new log's
    assert scan(log, {("in", 1): 0})[0] == {("in", 1): (1, 0)}


def test_dead_letters_after_a_state_load_wait_for_the_records_held_before_them() -> None:
    summing = (Pipeline("p", topics=("in",), format="json")
               .aggregate("n", key=lambda v: v["k"], init=lambda: 0,
                          fold=lambda s, v: s + v["n"]))
    r = runner(summing)
    batch = [Rec("in", 0, 1, b'{"k": "new"}'),  # held for the load, then its fold fails
             bad("in", 0, 2)]                   # fails at once, before the load
    sources = [dict(o.headers)["onceflow.source"] for o in r.process(batch).outputs]
    assert sources == [b"in/0/1", b"in/0/2"]  # in input order: the resume relies on it


def test_late_events_carry_their_index_and_a_replay_skips_those_written() -> None:
    batch = [Rec("in", 0, 0, envelope({"k": "a", "ts": [2 * MINUTE]})),
             Rec("in", 0, 1, envelope({"k": "a", "ts": [1_000, 3 * MINUTE, 2_000]}))]
    first = runner(windowed())
    first.process(batch[:1])  # the watermark passes minute 0 after this batch
    late = first.process(batch[1:]).outputs
    assert [(dict(o.headers)["onceflow.index"], dict(o.headers)["onceflow.pipeline"],
             o.partition) for o in late] == [(b"0", b"w", 0), (b"1", b"w", 0)]
    tail = TailScan({("in", 0): 0}, SideOrigin("w"), late_of=late_value)
    tail.feed((o.value, o.headers) for o in late[:1])  # killed after the first
    assert tail.written == {("in", 0): (1, 0)}
    assert tail.late == {("in", 0): {1: {("per_minute", (1, 0)): 0}}}
    replay = runner(windowed())
    replay.written.resume("late", tail.written, [("in", 0)])
    replay.side.late.resume(tail.late, [("in", 0)])
    replay.process(batch[:1])
    again = replay.process(batch[1:])
    # The value written late stays late (not produced again); the other is decided again.
    assert [(dict(o.headers)["onceflow.index"], dict(o.headers)["onceflow.position"])
            for o in again.outputs] == [(b"1", b"1.2")]
    assert again.late["per_minute"] == 2


class Counts:
    """Stands in for ``TailReader.partition_counts``: the topics the broker has."""

    def __init__(self, topics: dict[str, int]):
        self.topics = topics

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        return {t: n for t, n in self.topics.items() if t in topics}


def test_side_outputs_are_spread_over_their_topics_and_a_missing_one_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outputs = resumed_outputs(windowed(), "dead", "late")
    assert [(o.topic, o.side) for o in outputs] == [("dead", True), ("late", True)]
    assert [o.topic for o in resumed_outputs(counting(), "dead", "late")] == ["dead"]
    resume = ExclusiveResume(outputs, Counts({"dead": 3}), None, None,  # type: ignore[arg-type]
                             lambda who, error: None)
    placed, counts = asyncio.run(resume._placed())
    assert counts == {"dead": 3} and [o.topic for o in placed] == ["dead"]
    assert placed[0].plan({("in", 4): 7, ("in", 5): 0}) == \
        {("dead", 1): {("in", 4): 7}, ("dead", 2): {("in", 5): 0}}
    assert "topic 'late' does not exist yet" in caplog.text
