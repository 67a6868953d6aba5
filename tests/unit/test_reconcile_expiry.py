"""Rows the store may have dropped by rule are ``expired``, not ``missing`` (no services).

The bounds come from a ``Replay`` fed in two chunks with Kafka timestamps: a state's
newest folded record, a closed window's newest record applied before its chunk.
"""

from __future__ import annotations

from pathlib import Path

from onceflow.reconcile.compare import compare_stage
from onceflow.reconcile.expiry import Lifetimes, aged, restart_rule, root_of_route
from onceflow.reconcile.replay import Replay
from onceflow.runtime.config import load_settings
from onceflow.runtime.settings import Settings
from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.state import AggregateState, encode_state
from onceflow.testing import Record

COUNTS = (Pipeline("p", topics=("in",), format="json")
          .aggregate("n", key=lambda v: v["k"], init=int, fold=lambda n, _: n + 1))
WINDOWED = (Pipeline("w", topics=("in",), format="json")
            .aggregate("m", key=lambda v: v["k"], init=int, fold=lambda n, _: n + 1,
                       window=Tumbling(60_000, event_time_ms=lambda v: v["t"])))
NOW = 1_000_000.0  # seconds
HOUR_AGO, MINUTE_AGO = int((NOW - 3600) * 1000), int((NOW - 60) * 1000)


def settings(tmp_path: Path) -> Settings:
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "unused:pipeline"\n')
    return load_settings(conf)


def replayed(pipeline: Pipeline, tmp_path: Path, *chunks: list[Record]) -> Replay:
    replay = Replay(pipeline, settings(tmp_path))
    for chunk in chunks:
        replay.feed(chunk)
        replay.persist()
    return replay


def test_a_state_gone_past_expire_after_is_expired_one_gone_before_is_missing(
        tmp_path: Path) -> None:
    replay = replayed(COUNTS, tmp_path,
                      [Record({"k": "old"}, key="old", timestamp=HOUR_AGO),
                       Record({"k": "new"}, key="new", timestamp=HOUR_AGO)],
                      [Record({"k": "new"}, key="new", timestamp=MINUTE_AGO)])
    assert replay.timestamp("in", 0, 2) == MINUTE_AGO and replay.timestamp("in", 0, 3) is None
    mine = replay.recomputed("n")
    spec = COUNTS.aggregates[0]
    rule = aged(Lifetimes(states=600, history=0), mine, replay.timestamp, {}, now=NOW)
    found = {e.key: e for e in compare_stage(spec, (), (), mine, (), {("in", 0)}, aged=rule)}
    assert found["old"].verdict == "expired"  # folded an hour ago, expires after 10 min
    assert found["old"].rule is not None and found["old"].rule.startswith("expire-after 600 s")
    assert found["new"].verdict == "missing"  # folded a minute ago: cannot have expired
    never = aged(Lifetimes(states=0, history=0), mine, replay.timestamp, {}, now=NOW)
    assert {e.verdict for e in compare_stage(spec, (), (), mine, (), {("in", 0)},
                                             aged=never)} == {"missing"}


def test_history_rows_past_their_retention_and_states_with_an_open_window(
        tmp_path: Path) -> None:
    replay = replayed(WINDOWED, tmp_path,
                      [Record({"k": "a", "t": 1_000}, key="a", timestamp=HOUR_AGO),
                       Record({"k": "b", "t": 2_000}, key="b", timestamp=HOUR_AGO),
                       Record({"k": "a", "t": 1_000_000}, key="a", timestamp=HOUR_AGO)],
                      [Record({"k": "b", "t": 2_000_000}, key="b", timestamp=MINUTE_AGO),
                       Record({"k": "c", "t": 2_010_000}, key="c", timestamp=MINUTE_AGO)])
    closed = {(key, start): ms for (_, key, start), ms in replay.closed_after.items()}
    assert closed == {("a", 0): None,  # closed in the first chunk: no bound
                      ("b", 0): None,
                      ("a", 960_000): HOUR_AGO}  # closed in the second, after the first
    mine = replay.recomputed("m")
    history = list(replay.history("m"))
    spec = WINDOWED.aggregates[0]
    rule = aged(Lifetimes(states=600, history=600, windowed=True), mine, replay.timestamp,
                closed, now=NOW)
    found = {(e.key, e.window): e.verdict
             for e in compare_stage(spec, (), (), mine, history, {("in", 0)}, aged=rule)}
    assert found == {("a", 0): "expired", ("b", 0): "expired", ("a", 960_000): "expired",
                     ("a", None): "expired",  # every window closed, folded an hour ago
                     ("b", None): "missing", ("c", None): "missing"}  # an open window
    kept = aged(Lifetimes(states=600, history=7200, windowed=True), mine, replay.timestamp,
                closed, now=NOW)
    found = {(e.key, e.window): e.verdict
             for e in compare_stage(spec, (), (), mine, history, {("in", 0)}, aged=kept)}
    assert found[("a", 960_000)] == "missing"  # closed after input of an hour ago, kept 2 h
    assert found[("a", 0)] == "expired"  # no bound: it may be gone


def test_the_root_of_a_longer_route() -> None:
    assert root_of_route(("in", 3)) == ("in", 3)
    assert root_of_route(("in/3>hop", 1)) == ("in", 3)


def test_a_state_that_differs_after_a_gap_of_expire_after_may_have_restarted(
        tmp_path: Path) -> None:
    """Robot r went quiet for an hour (expire-after 10 min): its state may have expired
    and been started again by the next record, so a stored count of 1 is undecided, not
    drifted. Robot s, fed without such a gap, stored wrong, is drifted."""
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "unused:pipeline"\n'
                    "onceflow.state.expire-after = 10m\n")
    replay = Replay(COUNTS, load_settings(conf))
    chunks = [[Record({"k": "r"}, key="r", timestamp=HOUR_AGO),
               Record({"k": "r"}, key="r", timestamp=HOUR_AGO),
               Record({"k": "s"}, key="s", timestamp=MINUTE_AGO - 300_000)],
              [Record({"k": "r"}, key="r", timestamp=MINUTE_AGO),
               Record({"k": "s"}, key="s", timestamp=MINUTE_AGO)]]
    for chunk in chunks:
        replay.feed(chunk)
        replay.persist()
    assert replay.gaps == {("n", "r"): (HOUR_AGO, MINUTE_AGO)}
    mine = replay.recomputed("n")
    assert {key: state.value for key, state in mine.items()} == {"r": 3, "s": 2}
    stored = [(key, encode_state(AggregateState(value, mine[key].watermarks, mine[key].home)))
              for key, value in (("r", 1), ("s", 5))]
    restarted = {key: restart_rule(600, *gap) for (_, key), gap in replay.gaps.items()}
    found = {e.key: e for e in compare_stage(COUNTS.aggregates[0], stored, (), mine, (),
                                             {("in", 0)}, restarted=restarted)}
    assert found["r"].verdict == "maybe restarted"
    assert found["r"].rule is not None and found["r"].rule.startswith(
        "expire-after 600 s <= 3540 s between input of")
    assert found["s"].verdict == "drifted"
    equal = [(key, encode_state(mine[key])) for key in mine]  # a gap never hides equality
    assert {e.verdict for e in compare_stage(COUNTS.aggregates[0], equal, (), mine, (),
                                             {("in", 0)}, restarted=restarted)} == {"equal"}
