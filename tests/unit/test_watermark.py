"""Windows close on the stage's watermark: the lowest of the root partitions' highest
event times, with an idle timeout; silent keys close too; late decisions replay."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_runner import Rec

from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.output_tail import TailScan
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.side_outputs import SideOrigin, late_value
from onceflow.stages.watermark import OpenWindows, StageWatermark
from onceflow.testing import Record, TestRun

SIZE, LATENESS, DISORDER = 100, 60, 20


def counting(size: int = SIZE, lateness: int = LATENESS) -> Pipeline:
    """{"k": key, "ts": ms}: events per key per window."""
    return (Pipeline("w", topics=("in",), format="json")
            .aggregate("per_window", key=lambda e: e["k"], init=lambda: 0,
                       fold=lambda n, _: n + 1,
                       window=Tumbling(size, lambda e: e["ts"], allowed_lateness_ms=lateness)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watermark_is_the_lowest_root_and_an_idle_root_stops_holding_it() -> None:
    mark = StageWatermark("s", idle_timeout=10)
    mark.install(("in", 0), None)
    mark.observe(("in", 0), ("raw", 0), 500)
    mark.observe(("in", 0), ("raw", 1), 200)
    mark.observe(("in", 0), ("raw", 0), 400)  # out of order: no step back
    assert mark.advance() == 200
    mark.now = 5
    mark.observe(("in", 0), ("raw", 0), 900)
    assert mark.advance() == 200  # raw/1 lags: it holds the watermark
    mark.now = 11  # raw/1 has not risen for 11 s, raw/0 for 6
    assert mark.advance() == 900
    mark.observe(("in", 0), ("raw", 1), 300)  # back, behind: the watermark stays
    mark.now = 12
    assert mark.advance() == 900
    mark.now = 30  # everything idle: it stays too
    assert mark.advance() == 900


def test_a_first_start_waits_the_idle_timeout_for_root_partitions_it_has_not_met() -> None:
    mark = StageWatermark("s", idle_timeout=10, hold_new=True)
    mark.install(("in", 0), None)  # nothing written for it: the stage's first start
    mark.observe(("in", 0), ("raw", 0), 500)
    mark.now = 9
    assert mark.advance() is None  # raw/1 may still come
    mark.observe(("in", 0), ("raw", 1), 200)
    mark.now = 10
    assert mark.advance() == 200
    rows = mark.take_rows()
    back = StageWatermark("s", idle_timeout=10, hold_new=True)
    back.install(("in", 0), rows["s|wm|in|0"])  # a restart: the roots are known
    assert back.advance() == 200


def test_watermark_rows_read_back_hold_the_watermark_with_a_fresh_timeout() -> None:
    mark = StageWatermark("s", idle_timeout=10)
    mark.install(("in", 0), None)
    mark.observe(("in", 0), ("raw", 0), 500)
    mark.observe(("in", 0), ("raw", 1), 200)
    rows = mark.take_rows()
    assert list(rows) == ["s|wm|in|0"] and mark.take_rows() == {}
    back = StageWatermark("s", idle_timeout=10)
    back.now = 100.0  # a restart, much later
    back.install(("in", 0), rows["s|wm|in|0"])
    back.observe(("in", 0), ("raw", 0), 800)  # the first partition to deliver again
    assert back.advance() == 200  # raw/1 still holds it
    back.now = 111.0  # raw/1 has not risen since the restart
    back.observe(("in", 0), ("raw", 0), 900)
    assert back.advance() == 900


def test_the_open_window_index_drops_a_key_one_snapshot_after_it_closed() -> None:
    index = OpenWindows("s")
    index.install(("in", 0), None)
    index.note("a", ("in", 0), 100)
    index.note("b", ("in", 0), 200)
    assert json.loads(index.take_rows()["s|open|in|0"]) == ["a", "b"]
    index.note("a", ("in", 0), None)  # closed its last window: its state may not be written
    assert index.take_rows() == {}  # so the row keeps it for one more snapshot
    assert json.loads(index.take_rows()["s|open|in|0"]) == ["b"]  # now it is
    assert index.take_rows() == {}
    assert index.due(150) == [] and index.due(200) == ["b"]


def interleave(streams: list[list[tuple[str, int]]], picks: list[int]
               ) -> list[tuple[int, str, int]]:
    """The partitions' events merged in the order ``picks`` draws partitions (long runs of
    one partition: the others lag), then whatever is left. Each partition's first event
    comes first: a root partition the stage never met cannot hold its watermark."""
    at = [1] * len(streams)
    merged = [(p, *stream[0]) for p, stream in enumerate(streams)]
    for pick in picks:
        p = pick % len(streams)
        if at[p] < len(streams[p]):
            merged.append((p, *streams[p][at[p]]))
            at[p] += 1
    for p, stream in enumerate(streams):
        merged += [(p, *event) for event in stream[at[p]:]]
    return merged


@st.composite
def partition_streams(draw: Any) -> list[list[tuple[str, int]]]:
    """3 partitions, each a stream of keyed events whose times rise by 0..30 and are
    shifted back by up to DISORDER: bounded disorder, well within the lateness."""
    streams = []
    for _ in range(3):
        ts, events = 0, []
        for _ in range(draw(st.integers(5, 40))):
            ts += draw(st.integers(0, 30))
            events.append((draw(st.sampled_from("abcd")),
                           max(0, ts - draw(st.integers(0, DISORDER)))))
        streams.append(events)
    return streams


@settings(max_examples=150, deadline=None)
@given(streams=partition_streams(),
       picks=st.lists(st.integers(0, 2), max_size=200).map(
           lambda ps: [p for p in ps for _ in range(5)]),  # runs of 5: one partition at a time
       batch=st.integers(1, 7), crash_at=st.sets(st.integers(0, 120), max_size=3))
def test_bounded_disorder_within_lateness_is_never_late_whatever_the_lag(
        streams: list[list[tuple[str, int]]], picks: list[int], batch: int,
        crash_at: set[int]) -> None:
    # Each key's events come from every partition (a key re-keyed from many roots), the
    # partitions interleave with long lags, and the worker crashes: nothing is late and
    # every window holds exactly its events.
    run = TestRun(counting(), partitions=3, batch_size=batch)
    merged = interleave(streams, picks)
    for i, (p, key, ts) in enumerate(merged):
        run.feed([Record({"k": key, "ts": ts}, partition=p)])
        if i % 4 == 3:
            run.commit()
        if i in crash_at:
            run.crash()
    truth = Counter((key, ts - ts % SIZE) for _, key, ts in merged)
    assert run.late == [] and "per_window.late" not in run.counters
    assert run.windows("per_window") == dict(sorted(truth.items()))


def test_a_silent_key_still_closes_its_last_window_once_across_a_crash() -> None:
    run = TestRun(counting())
    run.feed([Record({"k": "silent", "ts": 10}), Record({"k": "silent", "ts": 20}),
              Record({"k": "busy", "ts": 30})])
    run.commit()
    run.crash()  # nothing in memory: "silent" is only in the store and its index row
    run.feed([Record({"k": "busy", "ts": t}) for t in (100, 150, 200)])  # passes 0 + 100 + 60
    run.persist()
    assert run.closed_windows("per_window", persisted=True) == {("busy", 0): 1, ("silent", 0): 2}
    assert run.states("per_window", persisted=True)["silent"] == {"open": {}, "max_ts": 200}
    run.crash()  # replays the records after the commit: closes them again, same rows
    run.feed([Record({"k": "busy", "ts": 400})])
    run.persist()
    assert run.closed_windows("per_window", persisted=True) == {
        ("busy", 0): 1, ("busy", 100): 2, ("busy", 200): 1, ("silent", 0): 2}
    assert run.windows("per_window") == {("busy", 0): 1, ("busy", 100): 2, ("busy", 200): 1,
                                         ("busy", 400): 1, ("silent", 0): 2}


def test_an_evicted_silent_key_is_read_back_and_closed() -> None:
    store: dict[str, Any] = {}
    runner = PipelineRunner(counting(), lambda spec, keys: {k: store[k] for k in keys
                                                            if k in store},
                            "dlq", max_states=1)
    runner.process([Rec("in", 0, 0, b'{"k": "silent", "ts": 10}')])
    table = runner.tables[0]
    table.take_dirty(1)
    store.update(table.states)  # written ...
    table.written(1)
    runner.process([Rec("in", 0, 1, b'{"k": "busy", "ts": 20}')])
    assert table.evict() == 1 and "silent" not in table.states  # ... and evicted
    runner.process([Rec("in", 0, 2, b'{"k": "busy", "ts": 300}')])
    assert table.closed == {("busy", 0): 1, ("silent", 0): 1}


def two_partitions(offset: int, partition: int, ts: int) -> Rec:
    return Rec("in", partition, offset, json.dumps({"k": "a", "ts": ts}).encode())


def test_a_replay_routes_late_again_what_a_run_before_it_wrote_late() -> None:
    # First run: partition 1 is there from the start, so partition 0's event at 55, after
    # one at 450, is late (the watermark passed its window). The late event is written,
    # then the worker dies before any state is. The replay meets partition 0 first and
    # alone, where the event is in time: folded, it would also be in the late-events
    # topic (counted twice). The scan's marks keep it late.
    first = PipelineRunner(counting(), lambda spec, keys: {}, "dlq", "late")
    first.process([two_partitions(0, 0, 10)])
    first.process([two_partitions(0, 1, 500)])
    first.process([two_partitions(1, 0, 450)])  # the watermark: 450, window [0, 100) closes
    (late,) = first.process([two_partitions(2, 0, 55)]).outputs
    assert first.tables[0].closed == {("a", 0): 1}
    tail = TailScan({("in", 0): 0}, SideOrigin("w"), late_of=late_value)
    tail.feed([(late.value, late.headers)])
    assert tail.late == {("in", 0): {2: {("per_window", (2,)): 0}}}

    def replay(marks: bool) -> PipelineRunner:
        runner = PipelineRunner(counting(), lambda spec, keys: {}, "dlq", "late")
        if marks:
            runner.side.late.resume(tail.late, [("in", 0)])
        outcome = runner.process([two_partitions(o, 0, ts) for o, ts in enumerate((10, 450, 55))])
        assert outcome.outputs == []  # nothing produced again
        return runner

    assert replay(marks=False).tables[0].closed == {("a", 0): 2}  # and once more as late
    assert replay(marks=True).tables[0].closed == {("a", 0): 1}
