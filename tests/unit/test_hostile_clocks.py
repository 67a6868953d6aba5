"""Time that producers and devices state is input, not truth (issue 29): a producer's
clock never decides whether its re-sends are dropped, and one far-future event time
neither forgets producers nor closes a partition's windows (onceflow.testing runs the
worker's runner)."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow import Pipeline, ProducerDedup
from onceflow.stages.windows import Tumbling
from onceflow.testing import Record, TestRun

NOW = 1_790_000_000_000  # 2026-09-21, the broker's clock in these tests
YEAR = 365 * 24 * 3600 * 1000
MINUTE = 60_000


def _dedup_sums() -> Pipeline:
    return (Pipeline("sums", topics=("in",), format="json",
                     dedup=ProducerDedup(producer="pid", sequence="seq"))
            .aggregate("total", key=lambda v: v["d"], init=lambda: 0,
                       fold=lambda s, v: s + v["n"]))


def _report(producer: str, seq: int, n: int, ts: int | None, device: str = "d") -> Record:
    return Record({"d": device, "n": n}, key=producer, timestamp=ts,
                  headers=[("pid", producer.encode()), ("seq", str(seq).encode())])


def test_a_producer_ten_years_behind_has_its_re_sends_dropped() -> None:
    """Its CreateTime is far below the partition's newest: by timestamps it would be
    forgotten at each record, and each re-send folded again."""
    run = TestRun(_dedup_sums())
    run.feed([_report("good", 1, 1, NOW)])
    run.feed([_report("stale", 1, 10, NOW - 10 * YEAR), _report("good", 2, 1, NOW + 5)])
    run.feed([_report("stale", 1, 10, NOW - 10 * YEAR + 1)])  # re-sent after a lost ack
    run.feed([_report("stale", 2, 100, NOW - 10 * YEAR + 2),
              _report("stale", 2, 100, NOW - 10 * YEAR + 3)])
    assert run.states("total") == {"d": 112}
    assert run.counters["source.producer_duplicates"] == 2
    run.commit()
    assert run.producer_duplicates == 2


def test_one_record_ten_years_ahead_forgets_no_producer() -> None:
    """By timestamps, the partition's newest would jump ten years and every producer
    seen before would be forgotten: their re-sends folded again."""
    run = TestRun(_dedup_sums())
    run.feed([_report(f"p{i}", 1, 1, NOW + i) for i in range(5)])
    run.feed([_report("ahead", 1, 1000, NOW + 10 * YEAR)])
    run.feed([_report(f"p{i}", 1, 1, NOW + 10 + i) for i in range(5)])  # re-sends
    run.feed([_report("ahead", 1, 1000, NOW + 10 * YEAR)])  # its own re-send too
    assert run.states("total") == {"d": 1005}
    assert run.counters["source.producer_duplicates"] == 6
    run.commit()
    run.crash()  # the row read back decides the same
    run.feed([_report("p0", 1, 1, NOW + 20)])
    run.persist()
    assert run.states("total") == {"d": 1005}
    assert run.producer_duplicates == 7


def test_producers_are_forgotten_after_idle_records_of_their_partition() -> None:
    pipeline = (Pipeline("sums", topics=("in",), format="json",
                         dedup=ProducerDedup(producer="pid", sequence="seq", idle_records=3))
                .aggregate("total", key=lambda v: v["d"], init=lambda: 0,
                           fold=lambda s, v: s + v["n"]))
    run = TestRun(pipeline)
    run.feed([_report("a", 5, 1, None), _report("b", 1, 1, None), _report("b", 2, 1, None),
              _report("a", 5, 1, None)])  # 3 offsets after its last: still known
    assert run.counters["source.producer_duplicates"] == 1
    run.feed([_report("b", 3, 1, None), _report("b", 4, 1, None), _report("b", 5, 1, None),
              _report("b", 6, 1, None), _report("a", 5, 1, None)])  # 4 after: forgotten
    assert run.states("total") == {"d": 8}
    assert run.counters["source.producer_duplicates"] == 1


def test_idle_timeout_ms_is_accepted_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="idle_records"):
        spec = ProducerDedup(producer="pid", sequence="seq", idle_timeout_ms=1000)
    assert spec.idle_records > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ProducerDedup(producer="pid", sequence="seq")
    with pytest.raises(ValueError, match="idle_records"):
        ProducerDedup(producer="pid", sequence="seq", idle_records=0)


def _minutes(max_future_ms: int | None = None) -> Pipeline:
    return (Pipeline("w", topics=("in",), format="json")
            .aggregate("per_minute", key=lambda v: v["d"], init=lambda: 0,
                       fold=lambda n, _: n + 1,
                       window=Tumbling(MINUTE, event_time_ms=lambda v: v["t"],
                                       **({} if max_future_ms is None
                                          else {"max_future_ms": max_future_ms}))))


def _event(t: int, broker: int | None, device: str = "d") -> Record:
    return Record({"d": device, "t": t}, key=device, timestamp=broker)


def test_an_event_ten_years_ahead_is_dead_lettered_and_later_values_fold() -> None:
    """One far-future event time used to become the watermark: every later value of
    the partition was late."""
    run = TestRun(_minutes())
    run.feed([_event(NOW + i * 1000, NOW + i * 1000) for i in range(3)])
    (ahead,) = run.feed([_event(NOW + 10 * YEAR, NOW + 3000)])
    later = run.feed([_event(NOW + MINUTE + i * 1000, NOW + MINUTE + i * 1000)
                      for i in range(5)])
    assert [letter.record for letter in run.dead_letters] == [ahead]
    reason = run.dead_letters[0].reason
    assert "per_minute" in reason and "3650d" in reason and "max-future 1h" in reason
    assert run.late == [] and "per_minute.late" not in run.counters
    assert len(later) == 5 and run.counters["per_minute.folded"] == 8
    assert run.windows("per_minute") == {("d", NOW - NOW % MINUTE): 3,
                                         ("d", NOW + MINUTE - NOW % MINUTE): 5}
    run.commit()
    run.crash()  # the watermark read back was never moved by it
    run.feed([_event(NOW + 2 * MINUTE, NOW + 2 * MINUTE)])
    assert run.late == [] and run.counters["per_minute.folded"] == 9


def test_the_bound_is_per_window_or_the_runs_and_inclusive() -> None:
    run = TestRun(_minutes(max_future_ms=MINUTE))
    run.feed([_event(NOW + MINUTE, NOW), _event(NOW + MINUTE + 1, NOW)])
    assert len(run.dead_letters) == 1 and "1m" in run.dead_letters[0].reason
    run = TestRun(_minutes(), max_future=1.0)
    run.feed([_event(NOW + 1000, NOW), _event(NOW + 1001, NOW), _event(NOW + 2 * YEAR, None)])
    assert len(run.dead_letters) == 1  # no Kafka timestamp: nothing to bound it by
    assert run.counters["per_minute.folded"] == 2
    with pytest.raises(ValueError, match="max_future_ms"):
        Tumbling(MINUTE, event_time_ms=int, max_future_ms=-1)


def test_far_past_values_are_late_by_the_usual_rule() -> None:
    run = TestRun(_minutes())
    run.feed([_event(NOW, NOW), _event(NOW + 3 * MINUTE, NOW + 3 * MINUTE),
              _event(NOW - 10 * YEAR, NOW + 3 * MINUTE), _event(-5, NOW + 3 * MINUTE)])
    assert run.dead_letters == []
    assert len(run.late) == 2 and run.counters["per_minute.late"] == 2


# --- fuzz: hostile clocks, re-sends, windows and crashes ----------------------------

#: Times a device or producer clock may state: far past and future, negative, huge, equal,
#: around the max-future edge, and anything in 64 bits.
HOSTILE = st.one_of(
    st.sampled_from([NOW, NOW - 10 * YEAR, NOW + 10 * YEAR, 0, -1, -5, 2**62, -(2**62),
                     NOW + 3_600_000, NOW + 3_600_001, 2**63 - 1, -(2**63)]),
    st.integers(NOW - 5 * MINUTE, NOW + 5 * MINUTE),  # non-monotonic, near one another
    st.integers(-(2**63), 2**63 - 1))


class Event(NamedTuple):
    producer: str
    seq: int
    device: str
    event_ms: int
    create_ms: int | None  # the Kafka CreateTime (None: the record has none)

    @property
    def partition(self) -> int:
        return int(self.producer[1:]) % 2

    @property
    def key(self) -> str:
        """A device's key per partition: each key is fed from one partition (its home), as
        in a worker of a group (a key fed from two, single-worker, is closed by either's
        watermark, so its late values depend on how the partitions interleave)."""
        return f"{self.device}{self.partition}"

    def record(self, create_ms: int | None) -> Record:
        return Record({"d": self.key, "t": self.event_ms, "s": self.seq},
                      partition=self.partition, key=self.producer,
                      timestamp=create_ms,
                      headers=[("pid", self.producer.encode()), ("seq", str(self.seq).encode())])


@st.composite
def hostile_streams(draw: Any) -> tuple[list[Event], list[Record]]:
    """Events of 4 producers (2 partitions) with hostile times, in an interleaved order,
    and the log: each event once, some re-sent later (a re-send's CreateTime is the
    producer's clock again: any time)."""
    events: list[Event] = []
    seqs = dict.fromkeys(("p0", "p1", "p2", "p3"), 0)
    for _ in range(draw(st.integers(1, 30))):
        producer = draw(st.sampled_from(sorted(seqs)))
        seqs[producer] += draw(st.integers(1, 3))  # gaps are fine
        events.append(Event(producer, seqs[producer], draw(st.sampled_from("xy")),
                            draw(HOSTILE), draw(st.none() | HOSTILE)))
    log = [event.record(event.create_ms) for event in events]
    for _ in range(draw(st.integers(0, 10))):
        i = draw(st.integers(0, len(events) - 1))
        at = draw(st.integers(0, len(log)))
        first = next(j for j, r in enumerate(log)
                     if r.headers == events[i].record(None).headers)
        log.insert(max(at, first + 1), events[i].record(draw(st.none() | HOSTILE)))
    return events, log


def _fuzzed() -> Pipeline:
    return (Pipeline("fz", topics=("in",), format="json",
                     dedup=ProducerDedup(producer="pid", sequence="seq"))
            .aggregate("total", key=lambda v: v["d"], init=lambda: 0, fold=lambda n, _: n + 1)
            .aggregate("per_minute", key=lambda v: v["d"], init=lambda: 0,
                       fold=lambda n, _: n + 1,
                       window=Tumbling(MINUTE, event_time_ms=lambda v: v["t"])))


def _outcome(log: list[Record], batch: int, actions: list[int]
             ) -> tuple[dict[Any, Any], dict[str, Any], set[Any], set[Any], int]:
    """Windows, totals, dead letters and late events (by source), producer duplicates."""
    run = TestRun(_fuzzed(), batch_size=batch, partitions=2)
    for i, record in enumerate(log):
        run.feed([record])
        action = actions[i % len(actions)] if actions else 0
        if action == 1:
            run.commit()
        elif action == 2:
            run.persist()
        elif action == 3:
            run.crash()
        elif action == 4:
            run.crash(mid_persist=True)
    run.commit()
    dead = {(d.record.partition, d.record.offset) for d in run.dead_letters}
    late = {(e.record.partition, e.record.offset, e.position) for e in run.late}
    return (run.windows("per_minute"), run.states("total"), dead, late,
            run.producer_duplicates)


@settings(max_examples=80, deadline=None)
@given(stream=hostile_streams(), batch=st.integers(1, 5),
       actions=st.lists(st.integers(0, 4), max_size=12))
def test_hostile_clocks_with_re_sends_windows_and_crashes_stay_exact(
        stream: tuple[list[Event], list[Record]], batch: int, actions: list[int]) -> None:
    events, log = stream
    windows, totals, dead, late, duplicates = _outcome(log, batch, actions)
    # Every re-send dropped, whatever the clocks; every event decided once.
    assert duplicates == len(log) - len(events)
    refused = {(e.producer, e.seq) for e in events
               if e.create_ms is not None and e.create_ms >= 0
               and e.event_ms > e.create_ms + 3_600_000}
    assert len(dead) == len(refused)
    folded = sum(windows.values())
    assert folded + len(late) + len(dead) + duplicates == len(log)
    assert sum(totals.values()) == folded + len(late)  # a dead letter folds nowhere
    for key in {e.key for e in events}:
        kept = [e for e in events if e.key == key and (e.producer, e.seq) not in refused]
        assert totals.get(key, 0) == len(kept)
    # Crashes, replays and batches decide exactly as one uninterrupted run.
    assert _outcome(log, 1, []) == (windows, totals, dead, late, duplicates)
