"""A single worker over several partitions: a replay interleaves them as the first run did.

With ``single_worker=True`` one key may be fed from several partitions, and its windows
close on whichever partition's watermark passes them first; a replay after a crash
may deliver the partitions in another interleaving. The merge log (``stages.merge_log``,
the join's) records the order in which the partitions' runs were applied, so the replay
closes each window, and judges each value late, at the first run's point. With
``ONCEFLOW_FAULT_NO_MERGE_LOG`` (arrival order) the same replay decides otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from onceflow import Pipeline, faults
from onceflow.stages import Tumbling
from onceflow.stages.merge_log import Run, needs_merge_log
from onceflow.stages.window_clock import IDLE_TIMEOUT
from onceflow.testing import Consumed, LateEvent, Record, TestRun

MINUTE = 60_000
Order = Callable[[list[Consumed]], Iterable[Consumed]]


def windowed() -> Pipeline[Any]:
    """Records are {"k": key, "ts": event time}; count events per key per minute."""
    return (Pipeline("w", topics=("in",), decode=lambda e: json.loads(e.payload))
            .aggregate("per_minute", key=lambda e: e["k"], init=lambda: 0,
                       fold=lambda n, _: n + 1,
                       window=Tumbling(MINUTE, event_time_ms=lambda e: e["ts"])))


def event(ts: int, partition: int, key: str = "a") -> Record:
    return Record({"k": key, "ts": ts}, partition=partition)


def low_partitions_first(records: list[Consumed]) -> list[Consumed]:
    return sorted(records, key=lambda r: r.partition)


def high_partitions_first(records: list[Consumed]) -> list[Consumed]:
    return sorted(records, key=lambda r: -r.partition)


def late_sources(late: list[LateEvent]) -> list[tuple[int, int]]:
    return [(event.record.partition, event.record.offset) for event in late]


def crash_and_replay(first: list[Record], replay: Order) -> tuple[TestRun, dict[Any, Any],
                                                                   list[tuple[int, int]]]:
    """Feed ``first`` one record a batch, crash with nothing persisted, replay in ``replay``'s
    interleaving: the run, and the first run's closed windows and late events."""
    run = TestRun(windowed(), batch_size=1)
    run.feed(first)
    closed, late = run.closed_windows("per_minute"), late_sources(run.late)
    run.crash(order=replay)
    return run, closed, late


# p1's early event, then p0's event two minutes on: minute 0 closes with p1's event in it.
# A replay of p0 first would close minute 0 before p1's event, and route it late.
FOLDED_FIRST = ([event(5_000, 1), event(130_000, 0)], low_partitions_first)
# p0 first: minute 0 closes, p1's event is late; a replay of p1 first would fold it.
LATE_FIRST = ([event(130_000, 0), event(5_000, 1)], high_partitions_first)


@pytest.mark.parametrize("case", [FOLDED_FIRST, LATE_FIRST], ids=["folded", "late"])
def test_a_replay_in_another_partition_order_decides_as_the_first_run(case: Any) -> None:
    run, closed, late = crash_and_replay(*case)
    assert run.closed_windows("per_minute") == closed  # the same closing, the same value
    assert late_sources(run.late) == late + late  # routed late again, the same events
    assert run.merge_log.runs[0] == [Run("in", 0, 0, r.partition) for r in case[0]]


@pytest.mark.parametrize("case", [FOLDED_FIRST, LATE_FIRST], ids=["folded", "late"])
def test_without_the_merge_log_the_replay_decides_otherwise(
        case: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "NO_MERGE_LOG", True)
    run, closed, late = crash_and_replay(*case)
    assert run.closed_windows("per_minute") != closed
    assert late_sources(run.late) != late + late


def test_which_pipelines_log_the_order() -> None:
    plain = Pipeline("p", topics=("in",)).map("m", str)
    assert needs_merge_log(windowed(), True, 3) and needs_merge_log(windowed(), True, None)
    assert not needs_merge_log(windowed(), True, 1)  # one partition: one order
    assert not needs_merge_log(windowed(), False, 3)  # keys homed: one partition each
    assert not needs_merge_log(plain, True, 3)  # no state: no result depends on order


def test_an_applied_record_delivered_again_is_a_duplicate_as_without_the_log() -> None:
    run = TestRun(windowed())
    first, _ = run.feed([event(5_000, 0), event(6_000, 1)])
    run.duplicate(first)
    assert run.counters["per_minute.duplicates"] == 1
    assert run.states("per_minute")["a"]["open"] == {"0": 2}


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, Any]]:
    steps = st.one_of(
        st.tuples(st.just("event"), st.tuples(st.sampled_from("ab"), st.integers(0, 5),
                                              st.integers(0, 2))),
        st.tuples(st.sampled_from(["persist", "commit"]), st.none()),
        st.tuples(st.just("crash"), st.sampled_from(["fed", "low", "high"])),
    )
    return draw(st.lists(steps, max_size=25))


def played(history: list[tuple[str, Any]], batch_size: int | None,
           waits: tuple[bool, float] = (False, IDLE_TIMEOUT)) -> tuple[TestRun, TestRun]:
    """The history on a run that crashes as it says, and on one fed the same events only;
    ``waits``: whether a first start waits (as the worker's does), and the idle timeout."""
    first, idle = waits
    run = TestRun(windowed(), batch_size=batch_size, first_start_waits=first, idle_timeout=idle)
    calm = TestRun(windowed(), first_start_waits=first, idle_timeout=idle)
    orders: dict[str, Order | None] = {"fed": None, "low": low_partitions_first,
                                       "high": high_partitions_first}
    for kind, arg in history:
        if kind == "event":
            key, minute, partition = arg
            record = event(minute * MINUTE + 1_000, partition, key)
            run.feed([record])
            calm.feed([record])
        elif kind == "persist":
            run.persist()
        elif kind == "commit":
            run.commit()
        else:
            run.crash(order=orders[arg])
    return run, calm


# A partition whose only event was committed before the crash (CI's draw of 2026-11-28):
# its read-back index entry moved the key back to it, away from the partition feeding it.
COMMITTED_BEFORE_A_CRASH = [("event", ("b", 0, 1)), ("commit", None), ("crash", "fed"),
                            ("event", ("b", 0, 0)), ("event", ("a", 1, 0)),
                            ("event", ("b", 0, 1))]
# A key listed by two partitions' index rows at the crash (p0's row keeps it one snapshot
# after p1 fed it): the state names p1, whose watermark closes it, as without the crash.
LISTED_BY_TWO_PARTITIONS = [("event", ("b", 0, 0)), ("persist", None), ("event", ("b", 0, 1)),
                            ("commit", None), ("crash", "fed"), ("event", ("a", 1, 0)),
                            ("event", ("b", 0, 1))]


@settings(max_examples=200, deadline=None)
@given(histories(), st.sampled_from([None, 1, 2]),
       st.tuples(st.booleans(), st.sampled_from([IDLE_TIMEOUT, 60.0, 150.0])))
@example(COMMITTED_BEFORE_A_CRASH, None, (False, IDLE_TIMEOUT))
@example(LISTED_BY_TWO_PARTITIONS, None, (False, IDLE_TIMEOUT))
def test_every_replay_ends_as_the_run_without_crashes(
        history: list[tuple[str, Any]], batch_size: int | None,
        waits: tuple[bool, float]) -> None:
    """Events over three partitions (event times in minutes 0..5, out of order across
    partitions), crashes replayed in any interleaving, with and without the worker's
    first-start wait, idle timeouts of 1 to 5 minutes: the windows and the late events
    end as in the same run without a crash."""
    run, calm = played(history, batch_size, waits)
    assert run.windows("per_minute") == calm.windows("per_minute")
    assert set(late_sources(run.late)) == set(late_sources(calm.late))


def test_a_run_names_its_partition_in_the_topic_and_a_join_run_does_not() -> None:
    from onceflow.kafka.merge_log_topic import decode_all, encode

    runs = [Run("in", 0, 4, 2), Run("in", 0, 1, 0)]
    assert encode(1, runs) == b'{"e":1,"r":[["in",0,4,2],["in",0,1,0]]}'
    assert encode(1, [Run("payments", 3, 5)]) == b'{"e":1,"r":[["payments",3,5]]}'
    assert decode_all([(0, encode(1, runs)), (1, encode(1, [Run("payments", 3, 5)]))]) == [
        *runs, Run("payments", 3, 5)]
