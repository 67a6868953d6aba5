"""After a chaos run (SIGKILLs and replays), every number the analytics job writes equals
the same number computed directly from the produced events' ground truth; for Redis and
Cassandra, and for the landing zone written by the same run."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from onceflow.analytics import readers
from onceflow.analytics.cli import run_analytics
from onceflow.analytics.frames import store_windows
from onceflow.analytics.landing import read_landing
from onceflow.devtools.chaos import ChaosOptions, StoreOpener, expected_windows, run_chaos
from onceflow.devtools.harness import packaged_config
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.examples import robots_report
from onceflow.examples.robot_chain import DAY_STAGE, MINUTE_STAGE, build_windows
from onceflow.examples.robots_report import HOUR_MS, JobOptions, run_job
from onceflow.runtime.config import Settings, load_settings

STAGES = (MINUTE_STAGE, DAY_STAGE)
Windows = dict[str, dict[tuple[str, int], Counter[str]]]


def read_table(path: Path) -> list[dict[str, Any]]:
    """Read a Spark output directory back with pyarrow (not Spark): an independent reader."""
    return pq.read_table(path).to_pylist()


def rate(failed: int, total: int) -> float:
    return failed / total if total else 0.0


def expected_tables(truth: Windows, settings: Settings, since: int | None = None,
                    until: int | None = None) -> dict[str, Any]:
    """Every table of the job, computed in plain Python from the ground truth."""
    a = settings.analytics
    keep = {stage: {slot: c for slot, c in windows.items()
                    if (since is None or slot[1] >= since) and (until is None or slot[1] < until)}
            for stage, windows in truth.items()}
    robot_windows = {(stage, robot, start): (c["ok"], c["failed"])
                     for stage, windows in keep.items() for (robot, start), c in windows.items()}
    fleet: dict[tuple[str, int], list[int]] = {}
    for (stage, _, start), (ok, failed) in robot_windows.items():
        row = fleet.setdefault((stage, start), [0, 0, 0])
        row[0] += 1
        row[1] += ok
        row[2] += failed
    fine = keep[MINUTE_STAGE]
    per_robot: dict[str, list[int]] = {}
    hourly: dict[int, list[Any]] = {}
    by_window: dict[int, list[tuple[str, Counter[str]]]] = {}
    for (robot, start), c in fine.items():
        totals = per_robot.setdefault(robot, [0, 0, 0])
        totals[0] += c["ok"]
        totals[1] += c["failed"]
        totals[2] += 1
        hour = hourly.setdefault(start - start % HOUR_MS, [set(), 0, 0])
        hour[0].add(robot)
        hour[1] += c["ok"]
        hour[2] += c["failed"]
        if c["ok"] + c["failed"] >= a.min_events:
            by_window.setdefault(start, []).append((robot, c))
    top = sorted(per_robot.items(), key=lambda item: (-item[1][1], item[0]))[: a.top_n]
    stats, anomalies = {}, {}
    for start, robots in by_window.items():
        rates = [rate(c["failed"], c["ok"] + c["failed"]) for _, c in robots]
        mean, std = statistics.fmean(rates), statistics.pstdev(rates)
        stats[start] = (len(robots), mean, std)
        for (robot, _), r in zip(robots, rates, strict=True):
            # Keep those within float noise of the threshold too: marked as borderline.
            if std > 0 and (r - mean) / std > a.anomaly_k - 1e-9:
                anomalies[(start, robot)] = (r - mean) / std
    return {"robot_windows": robot_windows, "fleet_windows": fleet, "top": top,
            "hourly": {h: (len(v[0]), v[1], v[2]) for h, v in hourly.items()},
            "stats": stats, "anomalies": anomalies, "k": a.anomaly_k}


def assert_job_matches(out: Path, want: Mapping[str, Any]) -> dict[str, int]:
    """Compare every output table with ``want``; returns how many numbers were compared."""
    compared = Counter[str]()
    got = read_table(out / "tables" / "robot_windows")
    assert len(got) == len(want["robot_windows"])
    for row in got:
        ok, failed = want["robot_windows"][(row["stage"], row["robot"], row["window_start"])]
        assert (row["ok"], row["failed"], row["total"]) == (ok, failed, ok + failed), row
        assert math.isclose(row["failure_rate"], rate(failed, ok + failed)), row
        compared["robot_windows"] += 4
    got = read_table(out / "tables" / "fleet_windows")
    assert len(got) == len(want["fleet_windows"])
    for row in got:
        robots, ok, failed = want["fleet_windows"][(row["stage"], row["window_start"])]
        assert (row["robots"], row["ok"], row["failed"]) == (robots, ok, failed), row
        assert math.isclose(row["failure_rate"], rate(failed, ok + failed)), row
        compared["fleet_windows"] += 4
    got = sorted(read_table(out / "tables" / "top_failing"), key=lambda r: (-r["failed"],
                                                                            r["robot"]))
    assert [(r["robot"], r["ok"], r["failed"], r["windows"]) for r in got] == [
        (robot, ok, failed, windows) for robot, (ok, failed, windows) in want["top"]]
    compared["top_failing"] += 4 * len(got)
    got = read_table(out / "tables" / "hourly_trend")
    assert {r["hour_start"]: (r["robots"], r["ok"], r["failed"]) for r in got} == want["hourly"]
    compared["hourly_trend"] += 3 * len(got)
    got = read_table(out / "tables" / "window_stats")
    assert len(got) == len(want["stats"])
    for row in got:
        robots, mean, std = want["stats"][row["window_start"]]
        assert row["robots"] == robots
        assert math.isclose(row["mean_rate"], mean, abs_tol=1e-12)
        assert math.isclose(row["std_rate"], std, abs_tol=1e-9)
        compared["window_stats"] += 3
    got = read_table(out / "tables" / "anomalies")
    k = want["k"]
    certain = {slot for slot, z in want["anomalies"].items() if z > k + 1e-9}
    assert certain <= {(r["window_start"], r["robot"]) for r in got} <= set(want["anomalies"])
    for row in got:
        assert math.isclose(row["z"], want["anomalies"][(row["window_start"], row["robot"])],
                            rel_tol=1e-9)
        compared["anomalies"] += 1
    return dict(compared)


def job_settings(store_settings: Mapping[str, str], landing: Path) -> Settings:
    """The settings ``onceflow analytics -c demo.conf --set ...`` would run with."""
    values = {**store_settings, "onceflow.landing.dir": str(landing),
              "onceflow.analytics.min-events": "3", "onceflow.analytics.anomaly-k": "2.0",
              "onceflow.analytics.top-n": "10"}
    return load_settings(packaged_config("demo.conf"), {
        key: value if value.replace(".", "").isdigit() else f'"{value}"'
        for key, value in values.items()})


@pytest.fixture(params=["redis", "cassandra"])
def store_settings(request: pytest.FixtureRequest, unique_name: Callable[..., str]
                   ) -> dict[str, str]:
    if request.param == "redis":
        redis: ServiceInfo = request.getfixturevalue("redis_service")
        return {"onceflow.stores.redis.url": f"redis://{redis.address}/0",
                "onceflow.stores.redis.key-prefix": f"analytics-{time.time_ns()}"}
    cassandra: ServiceInfo = request.getfixturevalue("cassandra_service")
    return {"onceflow.stores.cassandra.contact-points": cassandra.host,
            "onceflow.stores.cassandra.port": str(cassandra.port),
            "onceflow.stores.cassandra.keyspace": unique_name("an")}


def test_analytics_after_chaos_equal_ground_truth(
        spark: Any, kafka_service: ServiceInfo, store_settings: dict[str, str],
        tmp_path: Path) -> None:
    store = "redis" if "onceflow.stores.redis.url" in store_settings else "cassandra"
    seed = random.SystemRandom().randrange(1_000_000)
    landing = tmp_path / "landing"
    options = ChaosOptions(messages=5_000, duration=6.0, kills=4, seed=seed, store=store)
    report = run_chaos(options, bootstrap=kafka_service.address,
                       store_settings={**store_settings, "onceflow.landing.dir": str(landing)},
                       workdir=tmp_path)
    context = f"seed={seed}, logs in {tmp_path}: {report}"
    assert report.exact, context
    assert sum(report.kills.values()) == 4, context
    truth, _ = expected_windows(generate(options.messages, seed=seed, disorder=options.disorder),
                                report.late_events)

    settings = job_settings(store_settings, landing)
    pipeline = build_windows("unused", store)
    started = time.monotonic()
    result = run_analytics(settings, pipeline, out=tmp_path / "out", spark=spark,
                           job=robots_report.report)
    elapsed = time.monotonic() - started
    compared = assert_job_matches(tmp_path / "out", expected_tables(truth, settings))
    assert compared["robot_windows"] > 4 * 3_000, compared
    assert compared["anomalies"] > 0, compared  # the anomaly rule really fired
    assert result.report is not None and result.report.exists()
    assert all(p.stat().st_size > 10_000 for p in result.charts.values()), result.charts
    print(f"{store}: job {elapsed:.1f} s, numbers compared {compared}")

    # --since/--until: the same numbers restricted to a time range.
    starts = sorted(start for _, start in truth[MINUTE_STAGE])
    since, until = starts[len(starts) // 4], starts[3 * len(starts) // 4]
    windows = store_windows(spark, settings, pipeline, STAGES)
    run_job(spark, windows, JobOptions(STAGES, tmp_path / "range", since_ms=since,
                                       until_ms=until))
    assert_job_matches(tmp_path / "range", expected_tables(truth, settings, since, until))

    # The landing zone written by the same run: after the key dedup every closed window
    # is there with the value the store's history holds; count raw duplicates honestly.
    opener = StoreOpener(store, store_settings)
    history = {}
    with_store = opener("robots-windows")
    try:
        for stage in STAGES:
            for robot, start, value in with_store.scan_history(stage):
                history[(stage, robot, start)] = value.decode()
    finally:
        with_store.close()
    rows = read_landing(landing)
    distinct = {(r["stage"], r["key"], r["window_start"]): r["value"] for r in rows}
    for r in rows:  # copies of one window are equal
        assert distinct[(r["stage"], r["key"], r["window_start"])] == r["value"]
    assert distinct == history
    print(f"{store}: landing rows {len(rows)}, distinct windows {len(distinct)}, "
          f"history rows {len(history)}")
    landed = readers.landing_windows(spark, str(landing), STAGES)
    assert landed.count() == len(history)

