"""The chaos verifier: republisher and windowed aggregator SIGKILLed, every window exact.

On Redis the republisher writes a report's events as one record (a unit, the
default), on Cassandra one record per event (``ChaosOptions.units``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from onceflow.devtools.chaos import ChaosOptions, run_chaos
from onceflow.devtools.services import ServiceInfo


def check(report: object, context: str, units: bool) -> None:
    from onceflow.devtools.chaos import ChaosReport

    assert isinstance(report, ChaosReport)
    assert report.caught_up, context
    # Every event crossed the hop once: units hold a report's events in one record (how
    # many records the kills made the republisher write again is the kills' timing).
    assert report.normalized_events == report.events, context
    assert (report.normalized_once < report.events * 0.6) if units else (
        report.normalized_once == report.events), context
    assert sum(report.kills.values()) >= 10, context
    assert all(n >= 1 for n in report.kills.values()), context  # both processes died
    assert report.windows["per_robot_minute"] > 10_000, context
    assert report.lost == 0, context
    assert report.double == 0, context
    assert report.mismatched == {"per_robot_minute": 0, "per_robot_day": 0}, context
    # Whatever the kills caught: every record the republisher wrote twice holds an event
    # (units: a report's events) the aggregator discards; its own replays add to these.
    resent = report.normalized - report.normalized_once
    assert resent >= 0, context
    assert report.duplicates["per_robot_minute"] >= resent, context
    assert report.resends > 300, context  # the robots re-sent reports ...
    assert report.producer_duplicates == report.resends, context  # ... none got through
    assert report.late["per_robot_minute"] > 0, context  # lateness really exercised
    assert report.exit_codes == {"republisher": 0, "aggregator": 0}, context


def test_chaos_on_redis(kafka_service: ServiceInfo, redis_service: ServiceInfo,
                        tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(1_000_000)
    settings = {"onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": f"chaos-{time.time_ns()}"}
    report = run_chaos(ChaosOptions(kills=10, seed=seed, store="redis", units=True),
                       bootstrap=kafka_service.address, store_settings=settings,
                       workdir=tmp_path)
    check(report, f"seed={seed}, logs in {tmp_path}: {report}", units=True)


def test_chaos_on_cassandra(kafka_service: ServiceInfo, cassandra_service: ServiceInfo,
                            tmp_path: Path, unique_name: Callable[..., str]) -> None:
    seed = random.SystemRandom().randrange(1_000_000)
    settings = {"onceflow.stores.cassandra.contact-points": cassandra_service.host,
                "onceflow.stores.cassandra.port": str(cassandra_service.port),
                "onceflow.stores.cassandra.keyspace": unique_name("chaos")}
    report = run_chaos(ChaosOptions(kills=10, seed=seed, store="cassandra", units=False,
                                    duration=20.0),
                       bootstrap=kafka_service.address, store_settings=settings,
                       workdir=tmp_path)
    check(report, f"seed={seed}, logs in {tmp_path}: {report}", units=False)
