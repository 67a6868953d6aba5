"""/health's verdict: 503 with a reason for each way a worker is not doing its job."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from onceflow.actors import metrics
from onceflow.actors.supervisor import RestartLoop
from onceflow.runtime.health import HealthLog, health_report
from onceflow.stores.fencing import Fenced

RUNNING = {"core": "running", "consumer": "running"}


def lag(total: int | None, assigned: int | None = None) -> dict[str, Any]:
    return {"lag": total, "assigned": total if assigned is None else assigned,
            "partitions": None, "seconds_ago": 0.5, "error": None}


def test_running_and_caught_up_is_healthy() -> None:
    report = health_report("p", RUNNING, None, None, 60, lag(0))
    assert report["healthy"] and report["reasons"] == [] and report["lag"] == 0


def test_a_restart_loop_is_503_even_while_its_children_run() -> None:
    loop = {"child": "core", "repeats": 3, "error": "RuntimeError('x')", "seconds_since": 1.0}
    report = health_report("p", RUNNING, None, None, 60, lag(10), looping=loop)
    assert not report["healthy"] and report["lag"] == 10
    assert report["reasons"][0].startswith("restart loop: core failed 3 times in a row")


def test_a_recent_fence_is_503_also_behind_a_restart_loop() -> None:
    fenced = Fenced(("t", 0), None, 7)
    for error in (fenced, RestartLoop("core", 5, fenced)):
        report = health_report("p", RUNNING, None, None, 60, lag(0),
                               last_failure=("core", error, 2.0))
        assert any(r.startswith("fenced 2s ago") for r in report["reasons"]), report
    old = health_report("p", RUNNING, None, None, 60, lag(0),
                        last_failure=("core", fenced, 61.0))
    assert old["healthy"]


def test_behind_and_not_committing_is_503_from_the_groups_lag() -> None:
    metrics._last_commit -= 120  # nothing committed for two minutes
    try:
        assert not health_report("p", RUNNING, None, None, 60, lag(5))["healthy"]
        assert health_report("p", RUNNING, None, None, 60, lag(0))["healthy"]
        assert health_report("p", RUNNING, None, None, 60, lag(None))["healthy"]  # unread yet
        # Another member's partitions wait, this worker's are caught up: not its stall.
        assert health_report("p", RUNNING, None, None, 60, lag(5, assigned=0))["healthy"]
    finally:
        metrics.committed()


def test_restarting_and_overdue_joins_are_503() -> None:
    report = health_report("p", {"core": "backing_off", "consumer": "backing_off"}, None,
                           None, 60, lag(0))
    assert report["reasons"] == ["not running: core backing_off, consumer backing_off"]
    join = {"joining": True, "joining_seconds": 130.0, "join_timeout": 120.0,
            "join_overdue": True}
    report = health_report("p", RUNNING, join, None, 60, lag(0))
    assert report["reasons"][0].startswith("not assigned: the group join has taken 130.0s")


def test_the_log_tells_an_unhealthy_spell_past_its_grace_then_each_repeat_and_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sick = {"healthy": False, "reasons": ["behind and not committing: lag 5"],
            "consumer": {"joining": False, "fetch": {"in_flight": 4, "paused": ["t[0]"]}}}
    well = {"healthy": True, "reasons": []}
    told = HealthLog(grace=10, repeat=60)
    caplog.set_level(logging.INFO, logger="onceflow.runtime.health")
    for now, report in [(0, well), (5, sick), (10, sick)]:  # within the grace: a start's join
        told.observe(report, now)
    told.observe(well, 12)
    assert caplog.messages == []  # a spell shorter than the grace is not news
    for now in (20, 31, 40, 90, 91):  # told at 31 (11 s in), then at 91 (60 s later)
        told.observe(sick, now)
    told.observe(well, 95)
    assert caplog.messages == [
        "unhealthy for 11s (/health answers 503): behind and not committing: lag 5; "
        "fetch loop: {'in_flight': 4, 'paused': ['t[0]']}",
        "unhealthy for 71s (/health answers 503): behind and not committing: lag 5; "
        "fetch loop: {'in_flight': 4, 'paused': ['t[0]']}",
        "healthy again after 75s"]
