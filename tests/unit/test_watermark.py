"""Windows close on the stage's watermark: the lowest of the root partitions' highest
event times, with an idle timeout; silent keys close too; late decisions replay."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from fold_model import observe
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runner import Rec
from test_runner import envelope as renvelope

from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.side_outputs import SideOrigin, late_value
from onceflow.stages.tail_scan import TailScan
from onceflow.stages.watermark import OpenWindows, StageWatermark
from onceflow.testing import Record, TestRun, envelope

SIZE, LATENESS, DISORDER = 100, 60, 20


def counting(size: int = SIZE, lateness: int = LATENESS) -> Pipeline:
    """{"k": key, "ts": ms} envelopes: events per key per window."""
    return (Pipeline("w", topics=("in",), decode=lambda e: json.loads(e.payload))
            .aggregate("per_window", key=lambda e: e["k"], init=lambda: 0,
                       fold=lambda n, _: n + 1,
                       window=Tumbling(size, lambda e: e["ts"], allowed_lateness_ms=lateness)))


def test_the_watermark_is_the_lowest_root_and_a_root_far_behind_stops_holding_it() -> None:
    mark = StageWatermark("s", idle_ms=1_000)
    mark.install(("in", 0), None)
    observe(mark, ("in", 0), ("raw", 1), 200)
    observe(mark, ("in", 0), ("raw", 0), 500)
    observe(mark, ("in", 0), ("raw", 0), 400)  # out of order: no step back
    assert mark.partitions[("in", 0)].value == 200
    observe(mark, ("in", 0), ("raw", 0), 900)
    assert mark.partitions[("in", 0)].value == 200  # raw/1 lags: it holds the watermark
    observe(mark, ("in", 0), ("raw", 0), 1_500)  # raw/1 is more than 1 s behind
    assert mark.partitions[("in", 0)].value == 500
    observe(mark, ("in", 0), ("raw", 1), 300)  # back, behind: the watermark stays
    assert mark.partitions[("in", 0)].value == 500
    mark.install(("in", 1), None)  # another input partition has its own
    observe(mark, ("in", 1), ("raw", 1), 50)
    assert mark.partitions[("in", 1)].value == 50 and mark.partitions[("in", 0)].value == 500


def test_a_first_start_waits_for_root_partitions_it_has_not_met() -> None:
    mark = StageWatermark("s", idle_ms=1_000, hold_new=True)
    mark.install(("in", 0), None)  # nothing written for it: the stage's first start
    observe(mark, ("in", 0), ("raw", 0), 500)
    observe(mark, ("in", 0), ("raw", 0), 1_400)
    assert mark.partitions[("in", 0)].value is None  # raw/1 may still come
    observe(mark, ("in", 0), ("raw", 1), 600)
    observe(mark, ("in", 0), ("raw", 0), 1_500)  # 1 s past the first event met
    assert mark.partitions[("in", 0)].value == 600
    rows = mark.take_rows()
    back = StageWatermark("s", idle_ms=1_000, hold_new=True)
    back.install(("in", 0), rows["s|wm|in|0"])  # a restart: the roots are known
    assert back.partitions[("in", 0)].value == 600
    observe(back, ("in", 0), ("raw", 1), 700)
    assert back.partitions[("in", 0)].value == 700


def test_a_test_run_waits_at_its_first_start_as_the_worker_does_when_asked() -> None:
    def closed(first_start_waits: bool) -> dict[Any, Any]:
        run = TestRun(counting(), idle_timeout=1, first_start_waits=first_start_waits)
        run.feed([Record({"k": "a", "ts": 50}), Record({"k": "a", "ts": 300})])
        return run.closed_windows("per_window")

    assert closed(False) == {("a", 0): 1}  # 300 passed window 0's end plus lateness (160)
    assert closed(True) == {}  # held until 1 s of event time past the first event


def test_an_empty_partition_row_is_written_and_holds_nothing_after_a_restart() -> None:
    mark = StageWatermark("s", idle_ms=1_000, hold_new=True)
    mark.install(("in", 0), None)
    rows = mark.take_rows()
    back = StageWatermark("s", idle_ms=1_000, hold_new=True)
    back.install(("in", 0), rows["s|wm|in|0"])
    observe(back, ("in", 0), ("raw", 0), 100)
    assert back.partitions[("in", 0)].value is None  # still its first event: the hold starts here
    observe(back, ("in", 0), ("raw", 0), 1_100)
    assert back.partitions[("in", 0)].value == 1_100


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
    assert index.due(("in", 0), 150) == [] and index.due(("in", 0), 200) == ["b"]


def rekeyed(events: list[tuple[int, int, str, int]]) -> list[Record]:
    """(root partition, root offset, key, ts) -> records of one input partition, as a
    re-keying republisher writes them: each keyed event carries its root in its chain."""
    return [Record(envelope({"k": key, "ts": ts}, chain=[("raw", root, offset, 0)]))
            for root, offset, key, ts in events]


def interleave(streams: list[list[tuple[str, int]]], picks: list[int]
               ) -> list[tuple[int, int, str, int]]:
    """The root partitions' events merged in the order ``picks`` draws them (long runs of
    one root: the others lag), then whatever is left. Each root's first event comes
    first: a root partition the stage never met cannot hold its watermark."""
    at = [1] * len(streams)
    merged = [(p, 0, *stream[0]) for p, stream in enumerate(streams)]
    for pick in picks:
        p = pick % len(streams)
        if at[p] < len(streams[p]):
            merged.append((p, at[p], *streams[p][at[p]]))
            at[p] += 1
    for p, stream in enumerate(streams):
        merged += [(p, i, *event) for i, event in enumerate(stream) if i >= at[p]]
    return merged


@st.composite
def root_streams(draw: Any) -> list[list[tuple[str, int]]]:
    """3 root partitions, each a stream of keyed events whose times rise by 0..30 and are
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
@given(streams=root_streams(),
       picks=st.lists(st.integers(0, 2), max_size=200).map(
           lambda ps: [p for p in ps for _ in range(5)]),  # runs of 5: one root at a time
       batch=st.integers(1, 7), crash_at=st.sets(st.integers(0, 120), max_size=3))
def test_bounded_disorder_within_lateness_is_never_late_whatever_the_lag(
        streams: list[list[tuple[str, int]]], picks: list[int], batch: int,
        crash_at: set[int]) -> None:
    # Each key's events come from every root partition through one input partition (a
    # re-keying hop), the roots interleave with long lags, and the worker crashes:
    # nothing is late and every window holds exactly its events.
    run = TestRun(counting(), batch_size=batch, idle_timeout=10)
    merged = interleave(streams, picks)
    for i, record in enumerate(rekeyed(merged)):
        run.feed([record])
        if i % 4 == 3:
            run.commit()
        if i in crash_at:
            run.crash()
    truth = Counter((key, ts - ts % SIZE) for _, _, key, ts in merged)
    assert run.late == [] and "per_window.late" not in run.counters
    assert run.windows("per_window") == dict(sorted(truth.items()))


def test_a_replay_decides_as_the_first_run_whatever_the_batches() -> None:
    # Beyond the lateness some values are late; which ones is a function of the input
    # partition's records, so a run cut into other batches, with crashes, decides the same.
    events = [(r, o, "k", ts) for r, o, ts in
              [(0, 0, 0), (1, 0, 10), (0, 1, 400), (1, 1, 20), (1, 2, 450), (0, 2, 30),
               (1, 3, 40), (0, 3, 700), (1, 4, 120), (0, 4, 800), (1, 5, 900)]]

    def decided(batch: int, crash_at: set[int]) -> tuple[dict[Any, Any], list[str]]:
        run = TestRun(counting(), batch_size=batch, idle_timeout=10)
        for i, record in enumerate(rekeyed(events)):
            run.feed([record])
            if i % 3 == 2:
                run.commit()
            if i in crash_at:
                run.crash()
        return run.windows("per_window"), sorted(late.position for late in run.late)

    first = decided(1, set())
    assert first[1]  # some values really are late
    assert decided(4, {4, 8}) == first == decided(2, {2, 5, 9})


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
    runner.process([Rec("in", 0, 0, renvelope({"k": "silent", "ts": 10}))])
    table = runner.tables[0]
    table.take_dirty(1)
    store.update(table.states)  # written ...
    table.written(1)
    runner.process([Rec("in", 0, 1, renvelope({"k": "busy", "ts": 20}))])
    assert table.evict() == 1 and "silent" not in table.states  # ... and evicted
    runner.process([Rec("in", 0, 2, renvelope({"k": "busy", "ts": 300}))])
    assert table.closed == {("busy", 0): 1, ("silent", 0): 1}


def rooted(offset: int, root: int, ts: int) -> Rec:
    """A record of input partition 0 whose event came from root partition ``raw/root``."""
    return Rec("in", 0, offset, renvelope({"k": "a", "ts": ts}, [("raw", root, offset, 0)]))


def test_a_replay_routes_late_again_what_a_run_before_it_wrote_late() -> None:
    # The marks from the late-events topic (a second line of defence: decisions replay
    # the same anyway): a value the scan found late stays late, and is not produced again.
    first = PipelineRunner(counting(), lambda spec, keys: {}, "dlq", "late")
    first.process([rooted(0, 0, 10), rooted(1, 1, 500), rooted(2, 0, 450)])
    (late,) = first.process([rooted(3, 0, 55)]).outputs  # window [0, 100) closed at 450
    assert first.tables[0].closed == {("a", 0): 1}
    tail = TailScan({("in", 0): 0}, SideOrigin("w"), late_of=late_value)
    tail.feed([(late.value, late.headers)])
    assert tail.late == {("in", 0): {3: {("per_window", (3, 0)): 0}}}
    replay = PipelineRunner(counting(), lambda spec, keys: {}, "dlq", "late")
    replay.side.late.resume(tail.late, [("in", 0)])
    outcome = replay.process([rooted(o, r, ts) for o, r, ts in
                              ((0, 0, 10), (1, 1, 500), (2, 0, 450), (3, 0, 55))])
    assert outcome.outputs == [] and outcome.late["per_window"] == 1
    assert replay.tables[0].closed == {("a", 0): 1}
