"""How long a chaos run's worker process has held its assignment (``settled_for``): the
guard that keeps a strike from landing right after a rebalance."""

from __future__ import annotations

import time
from pathlib import Path

from onceflow.devtools.harness import WorkerProcess

ASSIGN = "INFO onceflow.kafka.rebalance: partitions assigned: [('t', 0)]\n"
REVOKE = "INFO aiokafka.consumer.group_coordinator: Revoking previously assigned partitions\n"


def test_the_time_held_counts_from_the_latest_assignment_and_stops_at_a_revoke(
        tmp_path: Path) -> None:
    worker = WorkerProcess(["true"], {}, tmp_path, "w")
    log = tmp_path / "w-0.log"
    worker.logs.append(log)
    log.write_text("worker started\n")
    assert worker.settled_for() is None
    log.write_text("worker started\n" + ASSIGN)
    first = worker.settled_for()
    assert first is not None
    time.sleep(0.05)
    held = worker.settled_for()
    assert held is not None and held >= first + 0.05  # the same assignment: it grows
    log.write_text("worker started\n" + ASSIGN + REVOKE)
    assert worker.settled_for() is None  # a rebalance under way
    log.write_text("worker started\n" + ASSIGN + REVOKE + ASSIGN)
    again = worker.settled_for()
    assert again is not None and again < held  # a new assignment: counted from now
    restarted = tmp_path / "w-1.log"
    restarted.write_text(ASSIGN)
    worker.logs.append(restarted)  # a restarted process: its own log, its own count
    fresh = worker.settled_for()
    assert fresh is not None and fresh < 0.05
