"""Exactly once, proven: a worker SIGKILLed at random moments under load.

Real Tansu broker and real Redis; the worker is a separate process killed
with SIGKILL and restarted; afterwards every robot's totals must equal the
ground truth recomputed from the produced events (each report once, though
the robots re-sent some), and the re-sends dropped must equal those produced.
"""

from __future__ import annotations

import random
from pathlib import Path

from onceflow.devtools.demo import DemoOptions, run_demo
from onceflow.devtools.services import ServiceInfo


def test_totals_exact_after_random_sigkills(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path
) -> None:
    seed = random.SystemRandom().randrange(1_000_000)
    options = DemoOptions(messages=40_000, kills=6, seed=seed)
    report = run_demo(
        options,
        bootstrap=kafka_service.address,
        redis_url=f"redis://{redis_service.address}/0",
        workdir=tmp_path,
    )
    context = f"seed={seed}, logs in {tmp_path}: {report}"
    assert report.events >= 100_000, context
    assert report.kills >= 5, context
    assert report.caught_up, context
    assert report.robots == report.robots_matching == 1000, context
    assert report.lost == 0, context
    assert report.double == 0, context
    assert report.replayed + report.duplicates > 0, context  # replays happened, were discarded
    assert report.resends > 500, context  # the robots re-sent reports (plain JSON) ...
    assert report.producer_duplicates == report.resends, context  # ... each dropped once
    assert report.final_exit_code == 0, context
    # onceflow reconcile, with no ground truth: the input replayed, every robot equal.
    assert report.reconciled is not None, context
    assert report.reconciled.exit_code == 0, f"{context}: {report.reconciled.as_dict()}"
    assert report.reconciled.counts == {"per_robot": {"equal": 1000}}, context
