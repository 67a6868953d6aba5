"""Source formats: envelope, json, bytes, str and user deserializers; record metadata;
wrongly declared formats and unparsable values dead-lettered with the promised reasons;
dead-letter warnings rate-limited per stage."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow import Pipeline
from onceflow.actors.dead_letter_log import DeadLetterWarnings
from onceflow.stages.formats import ENVELOPE_MARK, RecordMeta, json_value
from onceflow.testing import Record, TestRun, envelope


def counting(fmt: Any, **options: Any) -> Pipeline:
    """Counts values per ``str(value)``."""
    return (Pipeline("p", topics=("in",), format=fmt, **options)
            .aggregate("count", key=str, init=lambda: 0, fold=lambda n, _: n + 1))


@pytest.mark.parametrize(("fmt", "records", "states"), [
    ("json", [Record({"a": 1}), Record([1, 2]), Record("x")],
     {"{'a': 1}": 1, "[1, 2]": 1, "x": 1}),
    ("str", [Record("héllo"), Record(b"h\xc3\xa9llo")], {"héllo": 2}),
    ("bytes", [Record(b"\x00\x01"), Record("ab")], {"b'\\x00\\x01'": 1, "b'ab'": 1}),
    (lambda raw: raw.decode().upper(), [Record(b"ab"), Record("AB")], {"AB": 2}),
])
def test_each_format_parses_the_value_for_the_first_step(
        fmt: Any, records: list[Record], states: dict[str, int]) -> None:
    run = TestRun(counting(fmt))
    run.feed(records)
    assert run.dead_letters == []
    assert run.states("count") == states


def test_envelope_stays_the_default_and_decode_gets_the_parsed_value_of_raw_formats() -> None:
    enveloped = TestRun(Pipeline("p", topics=("in",), decode=lambda e: json.loads(e.payload))
                        .map("k", lambda v: v["k"])
                        .aggregate("count", key=str, init=lambda: 0, fold=lambda n, _: n + 1))
    enveloped.feed([Record({"k": "a"})])
    raw = TestRun(Pipeline("p", topics=("in",), format="json", decode=lambda v: v["k"])
                  .aggregate("count", key=str, init=lambda: 0, fold=lambda n, _: n + 1))
    raw.feed([Record({"k": "a"})])
    assert enveloped.states("count") == raw.states("count") == {"a": 1}


def test_the_first_step_sees_key_headers_timestamp_and_position() -> None:
    seen: list[tuple[Any, RecordMeta]] = []

    def keep(pair: tuple[Any, RecordMeta]) -> str:
        seen.append(pair)
        _value, meta = pair
        return f"{(meta.key or b'').decode()}/{(meta.header('site') or b'').decode()}"

    pipeline = (Pipeline("p", topics=("in",), format="json", with_meta=True)
                .map("site", keep)
                .aggregate("count", key=str, init=lambda: 0, fold=lambda n, _: n + 1))
    run = TestRun(pipeline)
    run.feed([Record({"v": 1}, key="dev-1", headers=[("site", b"north")], timestamp=1_700),
              Record({"v": 2}, key="dev-1", headers=[("site", b"north")], partition=2),
              Record({"v": 3}, headers=[("site", b"south")])])
    assert run.states("count") == {"dev-1/north": 2, "/south": 1}
    value, meta = seen[0]
    assert value == {"v": 1}
    assert meta == RecordMeta("in", 0, 0, b"dev-1", (("site", b"north"),), 1_700, None)
    assert (seen[1][1].partition, seen[1][1].offset, seen[2][1].offset) == (2, 0, 1)



def test_an_envelope_topic_with_meta_shows_the_envelope() -> None:
    seen: list[RecordMeta] = []
    pipeline = (Pipeline("p", topics=("in",), with_meta=True)
                .map("meta", lambda pair: seen.append(pair[1]) or pair[0]))
    TestRun(pipeline).feed([Record(envelope({"v": 1}, key="k1", event_time_ms=5,
                                            chain=[("raw", 3, 40, 1)]))])
    assert seen[0].envelope is not None
    assert (seen[0].envelope.key, seen[0].envelope.event_time_ms) == ("k1", 5)
    assert seen[0].envelope.source_chain[0].offset == 40


def test_an_envelope_on_a_json_topic_is_dead_lettered_naming_the_topic_and_both_formats() -> None:
    run = TestRun(counting("json"))
    marked = Record(envelope({"v": 1}), headers=[ENVELOPE_MARK])
    fed = run.feed([Record({"v": 0}), marked, Record({"v": 2})])
    assert [d.record for d in run.dead_letters] == [fed[1]]
    assert run.dead_letters[0].reason == (
        "topic 'in' is declared json but holds onceflow envelopes (header "
        "onceflow-format=envelope): declare format='envelope' for it")
    assert sum(run.states("count").values()) == 2  # nothing stops, nothing else is lost


def test_a_value_that_is_not_json_is_dead_lettered_with_the_parsers_message() -> None:
    run = TestRun(counting("json"))
    fed = run.feed([Record(b"{oops"), Record({"v": 1})])
    (dead,) = run.dead_letters
    assert dead.record == fed[0]
    assert dead.reason.startswith("topic 'in' is declared json but the value does not parse: "
                                  "JSONDecodeError: Expecting property name")
    assert run.counters["dead_letters"] == 1 and run.states("count") == {"{'v': 1}": 1}


def test_plain_json_on_an_envelope_topic_says_which_format_it_fits() -> None:
    run = TestRun(counting("envelope"))
    run.feed([Record(b'{"robot": "r1"}')])
    (dead,) = run.dead_letters
    assert dead.reason.startswith("undecodable envelope on topic 'in' (declared envelope, it "
                                  "has no onceflow-format header): ")
    assert dead.reason.endswith("; the value parses as JSON: declare format='json' for this topic")


def test_a_failing_user_deserializer_dead_letters_the_record_with_its_message() -> None:
    def strict(raw: bytes) -> int:
        if not raw.isdigit():
            raise ValueError(f"not a number: {raw!r}")
        return int(raw)

    run = TestRun(counting(strict))
    run.feed([Record(b"12"), Record(b"x1"), Record(b"12")])
    (dead,) = run.dead_letters
    assert dead.reason == ("topic 'in' is declared deserializer test_a_failing_user_deserializer_"
                           "dead_letters_the_record_with_its_message.<locals>.strict but the "
                           "value does not parse: ValueError: not a number: b'x1'")
    assert run.states("count") == {"12": 2}


def test_per_topic_formats_and_a_bad_declaration_is_refused() -> None:
    pipeline = (Pipeline("p", topics=("old", "new"), formats={"new": "json"},
                         decode=lambda v: v if isinstance(v, dict) else json.loads(v.payload))
                .aggregate("count", key=lambda v: v["k"], init=lambda: 0,
                           fold=lambda n, _: n + 1))
    run = TestRun(pipeline)
    run.feed([Record({"k": "a"}, topic="old"), Record({"k": "a"}, topic="new")])
    assert run.dead_letters == [] and run.states("count") == {"a": 2}
    with pytest.raises(ValueError, match="format 'xml': expected one of envelope, json"):
        Pipeline("p", topics=("in",), format="xml")
    with pytest.raises(ValueError, match="formats names 'other', which is not one of its"):
        Pipeline("p", topics=("in",), formats={"other": "json"})


def test_a_replayed_raw_record_is_a_duplicate_its_offset_is_its_root() -> None:
    run = TestRun(counting("json"))
    first, _ = run.feed([Record("a"), Record("a", partition=1)])
    run.duplicate(first)
    assert run.states("count") == {"a": 2}
    assert run.counters["count.duplicates"] == 1
    assert run.watermarks("count", "a") == {("in", 0): (0,), ("in", 1): (0,)}


def test_outputs_republished_from_a_raw_record_are_marked_envelopes_rooted_at_it() -> None:
    pipeline = (Pipeline("p", topics=("in",), format="json")
                .republish("out", "out", encode=lambda v: json.dumps(v).encode()))
    run = TestRun(pipeline)
    run.feed([Record({"v": 1}), Record({"v": 2}, key="dev-2", timestamp=1_234)])
    first, second = run.outputs("out")
    assert first.headers == {"onceflow-format": "envelope"}
    assert second.key == b"dev-2"
    assert (second.envelope.key, second.envelope.event_time_ms) == ("dev-2", 1_234)
    assert second.envelope.event_id == "in/0/1"
    assert [(r.topic, r.offset, r.index) for r in second.envelope.source_chain] == [("in", 1, 0)]
    downstream = TestRun(Pipeline("q", topics=("out",), format="json"))
    downstream.feed([Record(second.value, headers=[ENVELOPE_MARK])])
    assert "declared json but holds onceflow envelopes" in downstream.dead_letters[0].reason


def test_the_republished_event_time_is_the_kafka_timestamp_unless_given_or_carried() -> None:
    """What the republish guide says of ``onceflow-event-time-ms``."""
    def plain(**options: Any) -> TestRun:
        return TestRun(Pipeline("p", topics=("in",), format="json")
                       .republish("out", "out", format="json", **options))

    def times(run: TestRun) -> list[str]:
        return [o.headers["onceflow-event-time-ms"] for o in run.outputs("out")]

    run = plain()
    run.feed([Record({"ts": 5}, timestamp=1_234), Record({"ts": 6})])
    assert times(run) == ["1234", "0"]  # the Kafka timestamp (0 without one)
    given = plain(event_time_ms=lambda v: v["ts"])
    given.feed([Record({"ts": 5}, timestamp=1_234)])
    assert times(given) == ["5"]
    again = plain()  # a onceflow output read again keeps its event time, not its timestamp
    again.feed([Record(o.value, headers=list((k, v.encode()) for k, v in o.headers.items()),
                       timestamp=9_999, offset=10) for o in given.outputs("out")])
    assert times(again) == ["5"]
    enveloped = TestRun(Pipeline("e", topics=("in",)).republish(
        "out", "out", encode=lambda payload: payload, format="bytes"))
    enveloped.feed([Record(envelope({"v": 1}, event_time_ms=77), timestamp=1_234)])
    assert times(enveloped) == ["77"]  # an input envelope's own event time


def test_repartition_hops_stay_envelopes_under_a_json_source() -> None:
    pipeline = (Pipeline("p", topics=("in",), format="json")
                .repartition("by_k", key=lambda v: v["k"])
                .aggregate("count", key=lambda v: v["k"], init=lambda: 0,
                           fold=lambda n, _: n + 1))
    run = TestRun(pipeline, partitions=3)
    run.feed([Record({"k": "a"}), Record({"k": "b"}), Record({"k": "a"}, partition=1)])
    assert run.dead_letters == [] and run.states("count") == {"a": 2, "b": 1}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_dead_letters_warn_once_per_stage_and_reason_then_a_rate_limited_count(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    warnings = DeadLetterWarnings(logging.getLogger("t"), interval=10, clock=clock)
    with caplog.at_level(logging.WARNING, logger="t"):
        warnings.record({("source", "unparsable"): 500}, {("source", "unparsable"): "bad json"})
        clock.now += 5
        warnings.record({("source", "unparsable"): 500}, {("source", "unparsable"): "bad"})
        warnings.record({("explode", "ValueError"): 1, ("sum", "KeyHomedElsewhere"): 3},
                        {("explode", "ValueError"): "boom", ("sum", "KeyHomedElsewhere"): "x"})
        clock.now += 5
        warnings.flush()
        warnings.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("dead-lettered a record in stage 'source': bad json")
    assert lines[1].startswith("dead-lettered a record in stage 'explode': boom")
    assert lines[2] == "999 more records dead-lettered in stage 'source' in the last 10s"


json_documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(document=json_documents)
def test_json_values_read_as_the_json_module_reads_them(document: object) -> None:
    # orjson first, the json module for what orjson refuses (NaN, huge integers): the
    # value a pipeline sees must not depend on which one parsed it.
    text = json.dumps(document).encode()
    got, want = json_value(text), json.loads(text)
    assert json.dumps(got) == json.dumps(want)


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": 1,}', b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
                                  b"NaN", b"123456789012345678901234567890", b'{"a":1,"a":2}',
                                  b"-9223372036854775809", b"18446744073709551616",
                                  b'{"n": 1e400}', b'"\\ud800"'])
def test_json_edge_cases_and_errors_match_the_json_module(text: bytes) -> None:
    try:
        want: object = json.loads(text)
    except (ValueError, RecursionError) as error:
        with pytest.raises(type(error)):
            json_value(text)
    else:
        assert json.dumps(json_value(text)) == json.dumps(want)  # NaN != NaN, its dump is equal
