"""`onceflow analytics` for any pipeline: the guide's first (non-windowed) pipeline through
the generic report after SIGKILLs, and a user's --job over a windowed and a non-windowed
stage, every number against the stored states and the produced events' ground truth."""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import textwrap
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import onceflow.analytics
from onceflow.analytics.cli import cli as analytics_cli
from onceflow.analytics.landing import read_landing
from onceflow.analytics.overview import QUANTILES
from onceflow.devtools import harness
from onceflow.devtools.chaos import expected_windows
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.examples.robot_chain import MINUTE_STAGE
from onceflow.runtime.config import load_settings
from onceflow.stages.state import decode_state
from onceflow.stores.redis_store import RedisStore

MIXED_APP = '''
"""A pipeline with a non-windowed and a windowed aggregate, and a user job over both."""
import json
import os

from onceflow.examples.robots import count, fastenings, new_counts
from onceflow.stages import Pipeline, Tumbling

pipeline = (
    Pipeline("mixed", topics=(os.environ.get("MIXED_TOPIC", "unused"),), format="json")
    .flat_map("fastenings", fastenings)
    .aggregate("per_robot", key=lambda f: f.robot, init=new_counts, fold=count)
    .aggregate("per_minute", key=lambda f: f.robot, init=new_counts, fold=count,
               window=Tumbling(60_000, event_time_ms=lambda f: f.ts))
)


def job(spark, frames, out, settings):
    """Totals per robot from the plain stage, per robot and minute from the windowed one."""
    totals = {r["key"]: [r["ok"], r["failed"]] for r in frames["per_robot"].collect()}
    minutes = {f'{r["key"]}|{r["window_start"]}|{r["window_end"]}': [r["ok"], r["failed"]]
               for r in frames["per_minute"].collect()}
    (out / "job.json").write_text(json.dumps({"totals": totals, "minutes": minutes,
                                              "top_n": settings.analytics.top_n}))
'''


def spark_conf(tmp_path: Path, pipeline: str, redis_url: str, prefix: str) -> Path:
    conf = tmp_path / "app.conf"
    conf.write_text(textwrap.dedent(f'''\
        onceflow.pipeline = "{pipeline}"
        onceflow.stores.redis {{ url = "{redis_url}", key-prefix = "{prefix}" }}
        onceflow.analytics.top-n = 7
        onceflow.analytics.spark {{ master = "local[2]", ui-enabled = false }}
        '''))
    return conf


def run_worker(bootstrap: str, settings: Mapping[str, str], env: Mapping[str, str],
               tmp_path: Path, topic: str, ends: dict[int, int], kills: int) -> None:
    """The pipeline's worker, SIGKILLed ``kills`` times mid-stream, then run until every
    offset is committed and stopped with SIGTERM."""
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    worker = harness.WorkerProcess(argv, {**os.environ, **env}, tmp_path)

    async def run() -> None:
        await harness.kill_repeatedly(worker, kills, random.Random(5), gap=(0.5, 1.5))
        async with harness.CommittedOffsets(bootstrap, settings["onceflow.kafka.group-id"]
                                            ) as committed:
            assert await committed.wait_for(topic, ends, 120, worker), f"see {worker.logs[-1]}"

    asyncio.run(run())
    assert worker.kills == kills
    assert worker.terminate(timeout=15) == 0


def stored(redis_url: str, prefix: str, pipeline: str, stage: str) -> dict[str, Any]:
    store = RedisStore(redis_url, prefix, pipeline)
    try:
        return {key: decode_state(value).value for key, value in store.scan(stage)}
    finally:
        store.close()


def table(out: Path, name: str) -> list[dict[str, Any]]:
    """A report table read back with pyarrow, not Spark."""
    return pq.read_table(out / "tables" / f"{name}.parquet").to_pylist()


def test_readme_pipeline_generic_report_equals_stored_states_after_sigkills(
        spark: Any, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str]) -> None:
    bootstrap = kafka_service.address
    topic, prefix = unique_name("readme"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    stream = generate(4_000, robots=150, seed=21, resend=0.02)
    asyncio.run(harness.create_topic(bootstrap, topic, 4))
    ends = asyncio.run(harness.produce(bootstrap, topic, stream.messages))
    settings = {"onceflow.pipeline": "onceflow.examples.robots:pipeline",
                "onceflow.kafka.bootstrap-servers": bootstrap,
                "onceflow.kafka.group-id": unique_name("g"),
                "onceflow.stores.redis.url": redis_url,
                "onceflow.stores.redis.key-prefix": prefix,
                "onceflow.landing.dir": str(tmp_path / "landing")}
    run_worker(bootstrap, settings, {"ONCEFLOW_ROBOTS_TOPIC": topic}, tmp_path, topic, ends,
               kills=2)
    states = stored(redis_url, prefix, "robots", "per_robot")
    truth = {robot: {"ok": c["ok"], "failed": c["failed"]} for robot, c in stream.truth.items()}
    assert states == truth  # the pipeline itself is exact

    # The landing zone's history of the non-windowed stage: each key's latest row (highest
    # progress) is its stored state, and earlier rows are earlier states (never ahead).
    history = read_landing(tmp_path / "landing")
    assert {r["stage"] for r in history} == {"per_robot"}
    assert {r["key"] for r in history} == set(truth)
    landed = onceflow.analytics.states(
        spark, load_settings(spark_conf(tmp_path, "onceflow.examples.robots:pipeline",
                                        redis_url, prefix),
                             {"onceflow.landing.dir": str(tmp_path / "landing")}),
        "per_robot", source="landing")
    assert {r["key"]: {"ok": r["ok"], "failed": r["failed"]} for r in landed.collect()} == truth
    for row in history:
        value = json.loads(row["value"])
        assert value["ok"] <= truth[row["key"]]["ok"]
        assert value["failed"] <= truth[row["key"]]["failed"]

    conf = spark_conf(tmp_path, "onceflow.examples.robots:pipeline", redis_url, prefix)
    out = tmp_path / "report"
    assert analytics_cli(["-c", str(conf), "--out", str(out)]) == 0

    # The public reader: one typed row per key, equal to the stored states.
    frame = onceflow.analytics.states(spark, load_settings(conf, {}), "per_robot")
    assert set(frame.columns) == {"pipeline", "stage", "key", "value_json", "ok", "failed"}
    rows = frame.collect()
    assert {r["key"]: {"ok": r["ok"], "failed": r["failed"]} for r in rows} == states
    assert all(json.loads(r["value_json"]) == states[r["key"]] for r in rows)
    assert {(r["pipeline"], r["stage"]) for r in rows} == {("robots", "per_robot")}

    # The generic report: keys, distributions and top keys, from the states in plain Python.
    assert table(out, "stages") == [{"stage": "per_robot", "windowed": False, "keys": len(truth),
                                     "rows": len(truth), "windows": 0, "closed": 0,
                                     "fields": "failed,ok"}]
    dists = {r["field"]: r for r in table(out, "distributions")}
    assert set(dists) == {"ok", "failed"}
    for name, d in dists.items():
        values = sorted(s[name] for s in states.values())
        assert (d["count"], d["min"], d["max"]) == (len(values), values[0], values[-1])
        assert d["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
        for q in QUANTILES:  # an approximate percentile, but a value near its rank
            got = d[f"p{round(q * 100)}"]
            assert got in values
            rank = sum(v <= got for v in values) / len(values)
            assert abs(rank - q) <= 0.05 or values.count(got) > 1, (name, q, got, rank)
    for name in ("ok", "failed"):
        top = [(r["rank"], r["key"], r["total"]) for r in table(out, "top_keys")
               if r["field"] == name]
        want = sorted(states.items(), key=lambda item: (-item[1][name], item[0]))[:7]
        assert top == [(i, key, float(s[name])) for i, (key, s) in enumerate(want, start=1)]
    assert table(out, "over_time") == []
    charts = sorted(p.name for p in (out / "charts").glob("*.png"))
    assert charts == ["per_robot-distribution.png", "per_robot-top.png"]
    assert all((out / "charts" / c).stat().st_size > 10_000 for c in charts)
    page = (out / "report.html").read_text()
    assert "per_robot-distribution.png" in page and "per_robot-top.png" in page

    # `--source landing` reads the non-windowed stage too (each key's latest landed state):
    # the same keys, distributions and top keys as from the store.
    landed_out = tmp_path / "landed-report"
    assert analytics_cli(["-c", str(conf), "--source", "landing", "--out", str(landed_out),
                          "--set", f'onceflow.landing.dir="{tmp_path / "landing"}"']) == 0
    for name in ("stages", "distributions", "top_keys"):
        assert table(landed_out, name) == table(out, name), name


def test_user_job_and_generic_report_over_windowed_and_plain_stages(
        spark: Any, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap = kafka_service.address
    topic, prefix = unique_name("mixed"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    app = tmp_path / "app"
    app.mkdir()
    (app / "mixed_app.py").write_text(MIXED_APP)
    monkeypatch.syspath_prepend(str(app))
    stream = generate(3_000, robots=40, seed=33)  # in order: no window drops anything late
    asyncio.run(harness.create_topic(bootstrap, topic, 4))
    ends = asyncio.run(harness.produce(bootstrap, topic, stream.messages))
    settings = {"onceflow.pipeline": "mixed_app:pipeline",
                "onceflow.kafka.bootstrap-servers": bootstrap,
                "onceflow.kafka.group-id": unique_name("g"),
                "onceflow.stores.redis.url": redis_url,
                "onceflow.stores.redis.key-prefix": prefix}
    path = os.pathsep.join([str(app), os.environ.get("PYTHONPATH", "")])
    run_worker(bootstrap, settings, {"MIXED_TOPIC": topic, "PYTHONPATH": path}, tmp_path, topic,
               ends, kills=0)

    minutes = expected_windows(stream)[0][MINUTE_STAGE]  # every event in its minute
    assert len(minutes) == 3 * 40  # 150 s of events: three minutes of 40 robots

    conf = spark_conf(tmp_path, "mixed_app:pipeline", redis_url, prefix)
    out = tmp_path / "job-out"
    assert analytics_cli(["-c", str(conf), "--job", "mixed_app:job", "--out", str(out)]) == 0
    written = json.loads((out / "job.json").read_text())
    assert written["totals"] == {robot: [c["ok"], c["failed"]]
                                 for robot, c in stream.truth.items()}
    assert written["minutes"] == {f"{robot}|{start}|{start + 60_000}": [c["ok"], c["failed"]]
                                  for (robot, start), c in minutes.items()}
    assert written["top_n"] == 7

    # The generic report over the same pipeline: per window, keys and totals over time.
    out = tmp_path / "report"
    assert analytics_cli(["-c", str(conf), "--out", str(out)]) == 0
    stages = {r["stage"]: r for r in table(out, "stages")}
    assert stages["per_minute"]["windowed"] and not stages["per_robot"]["windowed"]
    assert stages["per_minute"]["rows"] == len(minutes)
    assert stages["per_minute"]["windows"] == len({start for _, start in minutes})
    assert 0 < stages["per_minute"]["closed"] < len(minutes)  # history rows and open windows
    want: dict[tuple[int, str], float] = Counter()
    keys: dict[int, set[str]] = {}
    for (robot, start), c in minutes.items():
        keys.setdefault(start, set()).add(robot)
        for name in ("ok", "failed"):
            want[(start, name)] += c[name]
    series = [r for r in table(out, "over_time") if r["stage"] == "per_minute"]
    assert {(r["window_start"], r["field"]): r["total"] for r in series} == want
    assert {r["window_start"]: r["keys"] for r in series} == {s: len(k) for s, k in keys.items()}
    assert {c.name for c in (out / "charts").glob("*.png")} == {
        "per_robot-distribution.png", "per_robot-top.png", "per_minute-distribution.png",
        "per_minute-top.png", "per_minute-over-time.png"}

    # A job that does not exist is a usage error, not a crash.
    assert analytics_cli(["-c", str(conf), "--job", "mixed_app:nothing"]) == 2
    assert analytics_cli(["-c", str(conf), "--job", "no_such_module_here:job"]) == 2
