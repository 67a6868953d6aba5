"""The start-up topic check skips the side-output topics left at reference.conf's names
(the broker creates those on first use) and checks every name set otherwise."""

from __future__ import annotations

from pathlib import Path

from onceflow.runtime.config import load_settings
from onceflow.runtime.preflight import DEAD_LETTER_KEY, LATE_EVENTS_KEY, side_topics
from onceflow.stages import Pipeline, Tumbling

PLAIN = Pipeline("plain", topics=("in",)).aggregate("n", key=str, init=int,
                                                     fold=lambda n, _: n + 1)
WINDOWED = Pipeline("windowed", topics=("in",)).aggregate(
    "n", key=str, init=int, fold=lambda n, _: n + 1,
    window=Tumbling(60_000, event_time_ms=lambda _: 0))


def test_only_named_side_topics_are_checked(tmp_path: Path) -> None:
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "m:p"\n')
    defaults = load_settings(conf)
    assert side_topics(defaults, WINDOWED) == {}  # reference.conf's names: left to the broker
    named = load_settings(conf, {DEAD_LETTER_KEY: "dlq", LATE_EVENTS_KEY: "late"})
    assert side_topics(named, WINDOWED) == {DEAD_LETTER_KEY: "dlq", LATE_EVENTS_KEY: "late"}
    assert side_topics(named, PLAIN) == {DEAD_LETTER_KEY: "dlq"}  # no windows: no late events
