"""Hostile input through the pure runner: every record folds or is dead-lettered with a
reason, nothing raises, and the valid records around hostile ones stay exact.

Three pipelines (robot reports as JSON, as onceflow envelopes, as a plain byte format),
each with and without producer dedup, key homes claimed as with several workers. The
fake store encodes keys as UTF-8 strictly, as Redis and Cassandra do, so a key that a
real store could not hold fails here too. Every produced record must be one aiokafka
can build and a default broker (1 MiB messages) accepts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import pytest
from aiokafka.producer.message_accumulator import BatchBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_repartition_and_homes import Homes
from test_runner import Rec

from onceflow.examples import robots
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages import Aggregate, Pipeline
from onceflow.stages.formats import ENVELOPE_MARK, FORMAT_HEADER, is_marked
from onceflow.stages.origin import CHAIN_HEADER, EVENT_TIME_HEADER, decode_chain, header
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, ProducerDedup
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, decode_state
from onceflow.testing import Record, TestRun

TOPIC = "in"
BROKER_MAX_MESSAGE = 1_048_576  # Kafka's default message.max.bytes


def _report_of_line(value: bytes) -> dict[str, Any]:
    """The byte format: ``serial|seq|1|0|1`` (ok/failed per fastening)."""
    serial, seq, *oks = value.decode().split("|")
    return {"serial": serial, "seq": int(seq),
            "results": [{"ok": ok == "1", "ts": 0} for ok in oks]}


def _by_header(dedup: bool) -> ProducerDedup | None:
    return ProducerDedup(producer="producer", sequence="seq", store="redis") if dedup else None


def pipeline(kind: str, dedup: bool) -> Pipeline:
    if kind == "json":  # the robots example as the e2e runs it
        built = robots.build(TOPIC)
        return built if dedup else Pipeline("robots", topics=(TOPIC,), format="json") \
            .flat_map("fastenings", robots.fastenings) \
            .aggregate("per_robot", key=attrgetter("robot"), init=robots.new_counts,
                       fold=robots.count)
    if kind == "envelope":
        start = Pipeline("env", topics=(TOPIC,), decode=lambda e: json.loads(e.payload),
                         dedup=_by_header(dedup))
    else:
        start = Pipeline("raw", topics=(TOPIC,), format="bytes", decode=_report_of_line,
                         dedup=_by_header(dedup))
    return (start.flat_map("fastenings", robots.fastenings)
            .aggregate("per_robot", key=attrgetter("robot"), init=robots.new_counts,
                       fold=robots.count))


def encode(kind: str, report: dict[str, Any]) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    """A report's value and headers in the pipeline's format."""
    headers = (("producer", report["serial"].encode()), ("seq", str(report["seq"]).encode()))
    if kind == "json":
        return json.dumps(report).encode(), headers
    if kind == "envelope":
        value = Envelope(key=report["serial"], payload=json.dumps(report).encode())
        return value.SerializeToString(), (*headers, ENVELOPE_MARK)
    oks = "|".join("1" if r["ok"] else "0" for r in report["results"])
    return f"{report['serial']}|{report['seq']}|{oks}".encode(), headers


class Store:
    """States, homes and producer tables in dicts; keys encoded as a real store must."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}

    def load(self, spec: Aggregate, keys: Sequence[str]) -> Mapping[str, AggregateState]:
        for key in keys:
            key.encode()  # redis-py and the Cassandra driver: strict UTF-8
        return {k: decode_state(self.rows[(spec.id, k)]) for k in keys
                if (spec.id, k) in self.rows}

    def load_sequences(self, keys: Sequence[str]) -> Mapping[str, bytes]:
        return {k: self.rows[(SEQUENCE_STAGE, k)] for k in keys if (SEQUENCE_STAGE, k) in self.rows}

    def persist(self, runner: PipelineRunner) -> None:
        for table in runner.tables:
            for key, data in table.take_dirty(0).items():
                self.rows[(table.spec.id, key.encode().decode())] = data
            table.written(0)
        if runner.sequences is not None:
            for key, data in runner.sequences.take_dirty().items():
                self.rows[(SEQUENCE_STAGE, key)] = data


# ---- hostile values -------------------------------------------------------------------

json_atoms = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                       st.text(max_size=8), st.just("\ud800"), st.just(10**4000))
json_values = st.recursive(json_atoms, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


# Strategies built once: a strategy built inside a composite is validated again at each
# draw, which cost most of these tests' time.
_serials = st.one_of(json_values, st.just("h-1"), st.just("\udcff"))
_seqs = st.one_of(json_values, st.integers(0, 50))
_results = st.one_of(json_values, st.lists(st.fixed_dictionaries(
    {"ok": json_values, "ts": json_values}), max_size=3))
_report_fields = st.sets(st.sampled_from(["serial", "seq", "results"]))


@st.composite
def odd_reports(draw: st.DrawFn) -> dict[str, Any]:
    """A report-shaped dict whose fields may have any type (a hostile ``serial``)."""
    report: dict[str, Any] = {
        "serial": draw(_serials),
        "seq": draw(_seqs),
        "results": draw(_results),
    }
    for name in draw(_report_fields):
        del report[name]
    return report


class Big(bytes):
    """A long value that prints short (hypothesis prints failing examples)."""

    def __repr__(self) -> str:
        return f"Big({bytes(self[:16])!r}... {len(self)} bytes)"


def _json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


def _deep(depth: int, opener: bytes) -> bytes:
    return opener * depth


def _nested_groups(depth: int) -> bytes:
    """Unknown protobuf field 15 as groups nested ``depth`` deep."""
    return b"\x7b" * depth + b"\x7c" * depth  # start group / end group, field 15


def _unknown_fields(value: bytes) -> bytes:
    """Unknown varint, length-delimited and fixed fields appended (a newer writer)."""
    return value + b"\xa0\x06\x01" + b"\xaa\x06\x03abc" + b"\xb5\x06\x00\x00\x00\x00"


#: Values no reader should choke on, made once (2 MB and 200,000 numbers among them).
_monsters = st.sampled_from([Big(v) for v in (
    _deep(100_000, b"["), _deep(5_000, b'{"a":'), b"[" * 999 + b"]" * 999,
    _nested_groups(10_000), _nested_groups(50), b"\xff" * 2_000_000,
    json.dumps(list(range(200_000))).encode(), b"1" * 5000)]
    + [b'"\\ud800"', b"NaN", b"\xef\xbb\xbf{}"])


@st.composite
def hostile_values(draw: st.DrawFn, kind: str) -> bytes | None:
    shaped = draw(odd_reports())
    valid_h = {"serial": "h-1", "seq": draw(st.integers(0, 10**6)),
               "results": [{"ok": True, "ts": 0}]}
    encoded_h = encode(kind, valid_h)[0]
    return draw(st.one_of(
        st.none(),
        st.binary(max_size=64),
        st.just(_json(shaped)),
        st.just(encoded_h[: draw(st.integers(0, len(encoded_h)))]),
        st.just(_unknown_fields(encoded_h)),
        st.just(Envelope(key="h-1", payload=_json(shaped)).SerializeToString()),
        _monsters,
    ))


header_names = st.one_of(st.sampled_from(["producer", "seq", FORMAT_HEADER, CHAIN_HEADER,
                                          EVENT_TIME_HEADER, "onceflow-event-id"]),
                         st.text(max_size=6),  # and any bytes, as the consumer reads them:
                         st.binary(max_size=6).map(lambda b: b.decode(errors="surrogateescape")))
header_values = st.one_of(
    st.none(), st.binary(max_size=12), st.just(b"\xff\xfe"), st.just(b"envelope"),
    st.just(b"json"), st.just(Big(b"9" * 4300)), st.just(b"-1"), st.just(b"1e3"),
    st.sampled_from([b"in/0/99999999/0", b"in/0/5/0", b"other/0/1/0,in/0/3/0", b"in/x/1/0",
                     b"/0/1/0", b"in/0/1", b"in/99999999999/1/0", b",",
                     Big(b"a/0/1/0," * 3000 + b"a/0/1/0")]))


_keys = st.one_of(st.none(), st.binary(max_size=8), st.just(Big(b"\xff" * 100_000)))
_headers = st.lists(st.tuples(header_names, header_values), max_size=5)
_timestamps = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))


@st.composite
def hostile_records(draw: st.DrawFn, kind: str) -> tuple[bytes | None, bytes | None,
                                                         tuple[tuple[str, Any], ...], int | None]:
    value = draw(hostile_values(kind))
    key = draw(_keys)
    headers = tuple(draw(_headers))
    timestamp = draw(_timestamps)
    return value, key, headers, timestamp


@dataclass(frozen=True)
class Fed:
    record: Rec
    valid: dict[str, Any] | None  # the report, for a valid record


def _check_producible(topic: str, key: bytes | None, value: bytes,
                      headers: tuple[tuple[str, bytes], ...]) -> None:
    """aiokafka builds it, and it fits a default broker's message size."""
    batch = BatchBuilder(1 << 20, 0)
    assert batch.append(timestamp=None, key=key, value=value, headers=list(headers)) is not None
    size = len(value) + len(key or b"") + sum(len(n.encode()) + len(v) for n, v in headers)
    assert size < BROKER_MAX_MESSAGE - 1024, f"{topic}: {size} bytes"


def _name_not_utf8(record: Rec) -> bool:
    """A record with a header name that is not UTF-8 (on any format)."""
    try:
        [name.encode() for name, _ in record.headers]
    except UnicodeEncodeError:
        return True
    return False


def _must_refuse(record: Rec) -> bool:
    """A raw record that says it holds an envelope, or whose chain is broken or forged."""
    if is_marked(record.headers):
        return True
    text = header(record.headers, CHAIN_HEADER)
    if text is None:
        return False
    try:
        root = decode_chain(text)[0]
    except ValueError:
        return True
    return (root.topic, root.partition) == (TOPIC, 0) and root.offset >= record.offset


def _run(kind: str, dedup: bool, stream: list[tuple[bool, Any]], cuts: list[int],
         make: Callable[[Store], PipelineRunner]) -> None:
    store = Store()
    fed: list[Fed] = []
    expected: dict[str, Counter[str]] = {}
    seqs: Counter[str] = Counter()
    for offset, (is_valid, item) in enumerate(stream):
        if is_valid:
            robot, oks = item
            report = {"serial": f"valid-{robot}", "seq": seqs[robot],
                      "results": [{"ok": ok, "ts": 0} for ok in oks]}
            seqs[robot] += 1
            value, headers = encode(kind, report)
            fed.append(Fed(Rec(TOPIC, 0, offset, value, report["serial"].encode(), headers,
                               1_000 + offset), report))
            counts = expected.setdefault(report["serial"], Counter(ok=0, failed=0))
            counts.update("ok" if ok else "failed" for ok in oks)
        else:
            value, key, headers, timestamp = item
            fed.append(Fed(Rec(TOPIC, 0, offset, value, key, headers, timestamp), None))
    runner = make(store)
    dead: Counter[str] = Counter()
    start = 0
    for cut in [*sorted(set(cuts)), len(fed)]:
        batch = [f.record for f in fed[start:cut]]
        if not batch:
            continue
        outcome = runner.process(batch)
        assert outcome.next_offsets == {(TOPIC, 0): batch[-1].offset + 1}
        for out in outcome.outputs:
            assert out.topic == "dlq"
            _check_producible(out.topic, out.key, out.value, out.headers)
            headers = dict(out.headers)
            assert headers["onceflow.reason"].strip(), out
            dead[headers["onceflow.source"].decode()] += 1
        store.persist(runner)
        start = cut
    assert all(n == 1 for n in dead.values()), dead
    for f in fed:
        if f.valid is None and (_name_not_utf8(f.record)
                                or (kind != "envelope" and _must_refuse(f.record))):
            assert f"{TOPIC}/0/{f.record.offset}" in dead, f.record
    valid_dead = [f.record.offset for f in fed
                  if f.valid is not None and f"{TOPIC}/0/{f.record.offset}" in dead]
    assert valid_dead == []
    states = {key: decode_state(data).value for (stage, key), data in store.rows.items()
              if stage == "per_robot" and key.startswith("valid-")}
    assert states == {serial: dict(c) for serial, c in expected.items()}


def _fuzz(kind: str, dedup: bool) -> Callable[..., None]:
    valid = st.tuples(st.integers(0, 3), st.lists(st.booleans(), min_size=1, max_size=4))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(st.tuples(st.just(True), valid),
                              st.tuples(st.just(False), hostile_records(kind))),
                    min_size=1, max_size=14),
           st.lists(st.integers(0, 14), max_size=3))
    def fuzz(stream: list[tuple[bool, Any]], cuts: list[int]) -> None:
        def make(store: Store) -> PipelineRunner:
            return PipelineRunner(pipeline(kind, dedup), store.load, "dlq", claim=Homes().claim,
                                  load_sequences=store.load_sequences)
        _run(kind, dedup, stream, cuts, make)

    return fuzz


test_json_with_dedup = _fuzz("json", True)
test_json_without_dedup = _fuzz("json", False)
test_envelope_with_dedup = _fuzz("envelope", True)
test_envelope_without_dedup = _fuzz("envelope", False)
test_bytes_with_dedup = _fuzz("bytes", True)
test_bytes_without_dedup = _fuzz("bytes", False)


# ---- the cases the fuzzing found, one by one ---------------------------------------------


def _robots(fmt: str = "json") -> Pipeline:
    return (Pipeline("robots", topics=(TOPIC,), format=fmt)
            .map("serial", itemgetter("serial"))
            .aggregate("per_robot", key=lambda serial: serial, init=lambda: 0,
                       fold=lambda n, _: n + 1))


def test_keys_no_store_can_hold_are_dead_lettered_and_the_batch_goes_on() -> None:
    run = TestRun(_robots(), single_worker=False)
    run.feed([Record({"serial": "r1"}), Record({"serial": 5}), Record({"serial": [1]}),
              Record(b'{"serial": "\\ud800"}'), Record({"serial": "r1"})])
    assert run.states("per_robot") == {"r1": 2}
    assert [(d.record.offset, d.reason) for d in run.dead_letters] == [
        (1, "stage 'per_robot': TypeError: key must be str, got int 5"),
        (2, "stage 'per_robot': TypeError: key must be str, got list [1]"),
        (3, "stage 'per_robot': ValueError: key '\\ud800' is not valid UTF-8 text: 'utf-8' "
            "codec can't encode character '\\ud800' in position 0: surrogates not allowed")]


@pytest.mark.parametrize("shape", [{}, {"format": "json"}, {"unit": True}])
def test_republish_keys_no_record_can_hold_are_dead_lettered_as_the_aggregate_path_says(
        shape: dict[str, Any]) -> None:
    run = TestRun(Pipeline("robots", topics=(TOPIC,), format="json")
                  .republish("out", "out", key=itemgetter("serial"), **shape))
    run.feed([Record({"serial": "r1"}), Record({"serial": 7}), Record({"serial": [1]}),
              Record(b'{"serial": "\\ud800"}'), Record({"serial": "r2"})])
    assert [o.key for o in run.outputs("out")] == [b"r1", b"r2"]
    assert [(d.record.offset, d.reason) for d in run.dead_letters] == [
        (1, "stage 'out': TypeError: key must be str, got int 7"),
        (2, "stage 'out': TypeError: key must be str, got list [1]"),
        (3, "stage 'out': ValueError: key '\\ud800' is not valid UTF-8 text: 'utf-8' "
            "codec can't encode character '\\ud800' in position 0: surrogates not allowed")]


def test_json_nested_too_deep_is_a_dead_letter_on_any_format() -> None:
    deep = b"[" * 100_000
    for fmt in ("json", "envelope"):
        run = TestRun(_robots(fmt))
        run.feed([Record(deep), Record({"serial": "r1"} if fmt == "json" else b"\x00")])
        assert run.dead_letters[0].record.offset == 0
        assert "RecursionError" in run.dead_letters[0].reason or fmt == "envelope"


def test_a_dead_letter_is_producible_whatever_the_record_holds() -> None:
    runner = PipelineRunner(_robots(), lambda spec, keys: {}, "dlq", dead_letter_max_value=1000)
    huge = Rec(TOPIC, 0, 7, b"\xff" * 5000, b"\xff" * 100, (("onceflow-format", None),
                                                         ("\udcff", b"\xff")))  # type: ignore
    (out,) = runner.process([huge]).outputs
    assert (out.key, out.value) == (None, b"\xff" * 1000)
    assert dict(out.headers)["onceflow.truncated"] == b"5000"
    assert dict(out.headers)["onceflow.source"] == b"in/0/7"
    _check_producible(out.topic, out.key, out.value, out.headers)


def test_a_long_or_unencodable_reason_is_cut_and_escaped() -> None:
    def fail(value: Any) -> Any:
        raise ValueError("\ud800" + "x" * 10_000)

    run = TestRun(Pipeline("p", topics=(TOPIC,), format="json").map("fail", fail))
    run.feed([Record({"a": 1})])
    (dead,) = run.dead_letters
    assert dead.reason.startswith("stage 'fail': ValueError: \\ud800xxx")
    assert dead.reason.endswith("... (10027 characters)")
    assert len(dead.reason) < 2100


@pytest.mark.parametrize(("chain", "reason"), [
    (b"in/0/1/0,", "header onceflow-chain='in/0/1/0,' (or onceflow-event-time-ms) does not "
                   "parse: ValueError: not enough values to unpack (expected 4, got 1)"),
    (b"in/0/-1/0", "header onceflow-chain='in/0/-1/0' (or onceflow-event-time-ms) does not "
                   "parse: ValueError: negative number in source chain hop 'in/0/-1/0'"),
    (b"\xff", "header onceflow-chain='\ufffd' (or onceflow-event-time-ms) does not parse: "
              "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: "
              "invalid start byte"),
    (b"in/0/3/0", "source chain rooted at in/0/3, not before the record itself (in/0/3): "
                  "forged or corrupt"),
    (b"in/0/9999/0", "source chain rooted at in/0/9999, not before the record itself "
                     "(in/0/3): forged or corrupt"),
    (b",".join([b"a/0/1/0"] * 101), "source chain of 101 hops (at most 100)"),
])
def test_chain_headers_that_lie_or_do_not_parse_are_dead_letters(chain: bytes,
                                                                  reason: str) -> None:
    run = TestRun(_robots())
    run.feed([Record({"serial": "r1"}, offset=2),
              Record({"serial": "r1"}, headers=[(CHAIN_HEADER, chain)]),
              Record({"serial": "r1"}, headers=[(CHAIN_HEADER, b"other/0/1/0")]),  # real
              Record({"serial": "r1"})])
    assert [(d.record.offset, d.reason) for d in run.dead_letters] == [(3, reason)]
    assert run.states("per_robot") == {"r1": 3}


def test_a_header_name_that_is_not_utf8_is_a_dead_letter_naming_its_bytes() -> None:
    read = b"\xff\xfebad".decode(errors="surrogateescape")  # as the worker's consumer reads it
    reason = "header name b'\\xff\\xfebad' is not UTF-8 (Kafka header names are strings)"
    run = TestRun(_robots())
    run.feed([Record({"serial": "r1"}),
              Record({"serial": "r1"}, headers=[("a", b"1"), (read, b"v")]),
              Record({"serial": "r1"}, headers=[("\u00e9t\u00e9", b"v")])])  # UTF-8: fine
    assert [(d.record.offset, d.reason) for d in run.dead_letters] == [(1, reason)]
    assert run.states("per_robot") == {"r1": 2}
    run = TestRun(_robots("envelope"))  # checked before the value is parsed, on any format
    run.feed([Record(b"\x00", headers=[(read, b"v")])])
    assert [d.reason for d in run.dead_letters] == [reason]


def test_a_format_header_that_lies_is_a_dead_letter() -> None:
    run = TestRun(_robots())
    run.feed([Record({"serial": "r1"}, headers=[ENVELOPE_MARK]),
              Record({"serial": "r1"}, headers=[(FORMAT_HEADER, b"json")])])
    assert [d.record.offset for d in run.dead_letters] == [0]
    assert run.states("per_robot") == {"r1": 1}


def test_dedup_refuses_producer_ids_and_sequences_that_would_bloat_or_poison_its_table() -> None:
    run = TestRun(robots.build(TOPIC))
    report = {"results": [{"ok": True, "ts": 0}]}
    run.feed([Record({**report, "serial": "r" * 1001, "seq": 1}),
              Record({**report, "serial": "r1", "seq": 2**63}),
              Record({**report, "serial": "r1", "seq": "9" * 4000}),
              Record({**report, "serial": "r1", "seq": 2**63 - 1})])
    assert [d.reason for d in run.dead_letters] == [
        "dedup: the producer id is 1001 characters long (at most 1000)",
        "dedup: the sequence must fit in 64 bits, got 9223372036854775808",
        f"dedup: the sequence must fit in 64 bits, got '{'9' * 99}... (4002 characters)"]
    assert run.states("per_robot") == {"r1": {"ok": 1, "failed": 0}}
