"""``onceflow reconcile``'s verdicts, over states a ``TestRun`` folded (no services).

What the e2e test cannot stage with a real broker: a stored state ahead of the
replay on a route or on an input partition the replay read nothing from, an
input whose head is gone (every verdict of it; test_reconcile_retention.py deletes a
head on a real broker), and a window a crash left both closed and open.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onceflow.reconcile.compare import Entry, compare_stage
from onceflow.reconcile.replay import Replay
from onceflow.runtime.config import load_settings
from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.state import AggregateState, decode_state, encode_state
from onceflow.testing import Record, TestRun

COUNTS = (Pipeline("p", topics=("in",), format="json")
          .aggregate("n", key=lambda v: v["k"], init=int, fold=lambda n, _: n + 1))
WINDOWED = (Pipeline("w", topics=("in",), format="json")
            .aggregate("m", key=lambda v: v["k"], init=int, fold=lambda n, _: n + 1,
                       window=Tumbling(1000, event_time_ms=lambda v: v["t"])))


def folded(pipeline: Pipeline, values: list[dict[str, Any]]) -> TestRun:
    run = TestRun(pipeline)
    run.feed([Record(v, key=v["k"], timestamp=v.get("t", 0)) for v in values])
    run.commit()
    return run


def rows(run: TestRun, stage: str) -> dict[str, AggregateState]:
    """The run's stored states, as the store rows decode."""
    return {key: AggregateState(value, run.watermarks(stage, key))
            for key, value in run.states(stage, persisted=True).items()}


def verdicts(entries: list[Entry]) -> dict[tuple[str, int | None], str]:
    return {(e.key, e.window): e.verdict for e in entries}


def test_equal_drifted_missing_unexpected_and_the_keys_asked_for() -> None:
    run = folded(COUNTS, [{"k": "a"}, {"k": "b"}, {"k": "a"}, {"k": "c"}])
    mine = rows(run, "n")
    stored = {"a": encode_state(AggregateState(3, mine["a"].watermarks)),  # one too many
              "b": encode_state(mine["b"]),
              "z": encode_state(AggregateState(1, {}))}  # c deleted, z written by hand
    found = list(compare_stage(COUNTS.aggregates[0], stored.items(), (), mine, (),
                               {("in", 0)}))
    assert verdicts(found) == {("a", None): "drifted", ("b", None): "equal",
                               ("c", None): "missing", ("z", None): "unexpected"}
    drifted = next(e for e in found if e.key == "a")
    assert (drifted.stored, drifted.recomputed) == (3, 2)
    only = list(compare_stage(COUNTS.aggregates[0], stored.items(), (), mine, (), {("in", 0)},
                              keys={"b", "c"}))
    assert verdicts(only) == {("b", None): "equal", ("c", None): "missing"}


def test_a_state_past_the_replay_is_ahead_and_a_lost_head_is_not_retained() -> None:
    run = folded(COUNTS, [{"k": "a"}, {"k": "b"}])
    mine = rows(run, "n")
    later = AggregateState(2, {("in", 0): (7,)})  # folded offset 7; the replay reached 1
    elsewhere = AggregateState(1, {("in", 1): (0,)})  # a partition the replay read nothing of
    stored = {"a": encode_state(later), "b": encode_state(mine["b"]),
              "y": encode_state(elsewhere)}
    found = compare_stage(COUNTS.aggregates[0], stored.items(), (), mine, (),
                          {("in", 0), ("in", 1)})
    assert verdicts(list(found)) == {("a", None): "ahead", ("b", None): "equal",
                                     ("y", None): "ahead"}
    stored["a"] = encode_state(AggregateState(5, mine["a"].watermarks))
    found = compare_stage(COUNTS.aggregates[0], stored.items(), (), mine, (), {("in", 0)},
                          retained=False)
    assert verdicts(list(found)) == {("a", None): "not retained", ("b", None): "equal",
                                     ("y", None): "not retained"}


def test_windows_each_closed_one_and_a_window_left_both_closed_and_open() -> None:
    values = [{"k": "a", "t": 100}, {"k": "a", "t": 1500}, {"k": "b", "t": 200},
              {"k": "a", "t": 5000}, {"k": "b", "t": 5100}]
    run = folded(WINDOWED, values)
    closed = run.closed_windows("m", persisted=True)
    assert closed[("a", 0)] == closed[("a", 1000)] == 1
    history = [(key, start, json.dumps(value).encode()) for (key, start), value in closed.items()]
    mine = {key: decode_state(encode_state(state)) for key, state in rows(run, "m").items()}
    assert "0" not in mine["a"].value["open"]
    # A crash between a window's history row and its state: the state still holds it open.
    both = AggregateState({**mine["a"].value, "open": {**mine["a"].value["open"], "0": 1}},
                          mine["a"].watermarks)
    stored = {"a": encode_state(both), "b": encode_state(mine["b"])}
    spec = WINDOWED.aggregates[0]
    broken = [(k, s, b"2" if (k, s) == ("a", 1000) else v) for k, s, v in history]
    found = verdicts(list(compare_stage(spec, stored.items(), broken, mine, history,
                                        {("in", 0)})))
    assert found.pop(("a", 1000)) == "drifted"
    assert set(found.values()) == {"equal"} and ("a", 0) in found and ("b", None) in found
    kept = [row for row in history if row[:2] != ("a", 1000)]
    found = verdicts(list(compare_stage(spec, stored.items(), [r for r in kept if r[:2] != (
        "a", 0)], mine, history, {("in", 0)})))
    assert found[("a", 0)] == "missing"
    assert found[("a", None)] == "drifted"  # its history row gone: the window counts as open


def test_a_stored_row_that_is_no_state_is_named_not_fatal() -> None:
    run = folded(COUNTS, [{"k": "a"}, {"k": "b"}])
    mine = rows(run, "n")
    stored = {"a": b"garbage", "b": encode_state(mine["b"]), "q": b"{}"}
    found = list(compare_stage(COUNTS.aggregates[0], stored.items(), (), mine, (), {("in", 0)}))
    assert verdicts(found) == {("a", None): "drifted", ("b", None): "equal",
                               ("q", None): "unexpected"}
    assert next(e for e in found if e.key == "a").stored.startswith("undecodable: ")


def test_the_replay_keeps_no_record_and_follows_the_stored_key_homes(tmp_path: Path) -> None:
    """Two partitions feed key k (no repartition, several workers): which one is its home
    was a race the input does not record, so the replay takes the stored state's."""
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "unused:pipeline"\n')
    settings = load_settings(conf)
    assert not settings.single_worker
    records = [Record({"k": "k"}, partition=0), Record({"k": "k"}, partition=1),
               Record({"k": "k"}, partition=1)]
    first_met = Replay(COUNTS, settings)
    first_met.feed(records)
    first_met.persist()
    assert first_met.log() == []  # nothing kept of the records
    assert first_met.recomputed("n")["k"].value == 1  # partition 0 met first: its home
    assert first_met.counters["dead_letters"] == 2
    stored = Replay(COUNTS, settings, homes=lambda spec, keys: {"k": ("in", 1)})
    stored.feed(records)
    stored.persist()
    assert stored.recomputed("n")["k"].value == 2  # the stored home: partition 1
    assert stored.counters["dead_letters"] == 1
    assert stored.sent == {settings.kafka.dead_letter_topic: 1}


def test_a_window_the_store_closed_past_a_cut_is_ahead_not_drift() -> None:
    """``--from-offsets committed-at:TS``: a key untouched since TS whose window other keys'
    later records closed: its state is equal less that window, the history row ahead."""
    mine = rows(folded(WINDOWED, [{"k": "a", "t": 100}]), "m")
    assert mine["a"].value["open"] == {"0": 1}
    closed = AggregateState({**mine["a"].value, "open": {}}, mine["a"].watermarks)
    stored = {"a": encode_state(closed)}
    history = [("a", 0, b"1")]
    spec = WINDOWED.aggregates[0]
    cut = verdicts(list(compare_stage(spec, stored.items(), history, mine, (), {("in", 0)},
                                      cut=True)))
    assert cut == {("a", None): "equal", ("a", 0): "ahead"}
    whole = verdicts(list(compare_stage(spec, stored.items(), history, mine, (), {("in", 0)})))
    assert whole == {("a", None): "drifted", ("a", 0): "unexpected"}


def test_a_key_fed_from_a_partition_whose_head_is_gone_is_never_equal() -> None:
    run = TestRun(COUNTS)
    run.feed([Record({"k": "a"}, key="a", partition=0), Record({"k": "b"}, key="b",
                                                                partition=1)])
    run.commit()
    mine = rows(run, "n")
    stored = {key: encode_state(state) for key, state in mine.items()}
    found = compare_stage(COUNTS.aggregates[0], stored.items(), (), mine, (),
                          {("in", 0), ("in", 1)}, retained=False, lost={("in", 1)})
    assert verdicts(list(found)) == {("a", None): "equal", ("b", None): "not retained"}


def test_a_drifted_state_names_the_records_it_lacks_as_the_watermarks_tell() -> None:
    run = TestRun(COUNTS)
    run.feed([Record({"k": "a"}, key="a", partition=0), Record({"k": "b"}, key="b"),
              Record({"k": "a"}, key="a"), Record({"k": "a"}, key="a"),
              Record({"k": "a"}, key="a", partition=1), Record({"k": "c"}, key="c")])
    run.commit()
    mine = rows(run, "n")
    assert mine["a"].watermarks == {("in", 0): (3,), ("in", 1): (0,)}
    stored = {"a": encode_state(AggregateState(1, {("in", 0): (0,)})),  # lost 2, 3 and in/1
              "b": encode_state(AggregateState(2, mine["b"].watermarks)),  # same records
              "c": encode_state(mine["c"])}
    found = {e.key: e for e in compare_stage(COUNTS.aggregates[0], stored.items(), (), mine,
                                             (), {("in", 0), ("in", 1)})}
    assert found["a"].verdict == "drifted"
    assert found["a"].records == ("in/0@3, and any of 1..2",
                                  "in/1@0, and any before it: the store folded none of them")
    assert found["b"].records == ("the same records by the watermarks: folded to another value",)
    assert found["c"].verdict == "equal" and found["c"].records == ()
