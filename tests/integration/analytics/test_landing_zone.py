"""The Parquet handoff is idempotent: SIGKILL between writing landing files and committing,
restart, and the landing zone holds every closed window exactly once; then the streaming
follower's fleet counters equal the zone's."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onceflow.analytics.cli import cli as analytics_cli
from onceflow.analytics.follow import follow_stages
from onceflow.analytics.landing import read_landing
from onceflow.devtools import harness
from onceflow.devtools.chaos import expected_windows, read_late, stored_windows
from onceflow.devtools.robot_stream import fastening_events, generate
from onceflow.devtools.services import ServiceInfo
from onceflow.examples.robot_chain import DAY_STAGE, MINUTE_STAGE
from onceflow.stores.redis_store import RedisStore

STAGES = (MINUTE_STAGE, DAY_STAGE)



def counted(counters: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    return {s: (c["rows"], c["sums"]["ok"], c["sums"]["failed"]) for s, c in counters.items()}


def wait_killed(worker: harness.WorkerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while worker.exited() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.exited() == -9, f"expected a SIGKILL; see {worker.logs[-1]}"


def test_kill_between_landing_and_commit_leaves_no_duplicate_rows(
        spark: Any, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str]) -> None:
    bootstrap = kafka_service.address
    topic, group, prefix = unique_name("land"), unique_name("g"), unique_name("p")
    landing = tmp_path / "landing"
    stream = generate(3_000, robots=40, seed=11, disorder=0.05)
    late_topic = unique_name("late")
    asyncio.run(harness.create_topic(bootstrap, topic, 4))
    asyncio.run(harness.create_topic(bootstrap, late_topic, 4))
    ends = asyncio.run(harness.produce(bootstrap, topic, fastening_events(stream)))
    settings = {
        "onceflow.pipeline": "onceflow.examples.robot_chain:windows",
        "onceflow.kafka.bootstrap-servers": bootstrap,
        "onceflow.kafka.group-id": group,
        "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
        "onceflow.stores.redis.key-prefix": prefix,
        "onceflow.landing.dir": str(landing),
        "onceflow.kafka.late-events-topic": late_topic,
    }
    env = {**os.environ, "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": topic,
           "ONCEFLOW_ROBOTS_STORE": "redis"}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)

    first = harness.WorkerProcess(argv, {**env, "ONCEFLOW_FAULT_KILL_AFTER_LANDING": "1"},
                                  tmp_path, "faulty")
    first.start()
    wait_killed(first)
    before = {r["file"]: r for r in read_landing(landing)}
    assert before, "the worker died after writing landing files"
    committed = asyncio.run(_committed(bootstrap, group, topic))
    assert committed != ends  # the flush that wrote them was not committed

    second = harness.WorkerProcess(argv, env, tmp_path, "restarted")
    second.start()
    asyncio.run(_drained(bootstrap, group, topic, ends, second))
    asyncio.run(second.assigned())
    assert second.terminate(timeout=15) == 0

    rows = read_landing(landing)
    keys = Counter((r["stage"], r["key"], r["window_start"]) for r in rows)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1][:5]  # no duplicates
    after = {r["file"]: r for r in rows}
    for name, row in before.items():  # files written before the kill were kept as they were
        assert after[name] == row
    store = RedisStore(settings["onceflow.stores.redis.url"], prefix, "robots-windows")
    late, twice = asyncio.run(read_late(bootstrap, late_topic, 4))
    truth, _ = expected_windows(stream, late)
    assert twice == 0
    try:
        for stage in STAGES:
            history = {(robot, start): json.loads(value)
                       for robot, start, value in store.scan_history(stage)}
            landed = {(r["key"], r["window_start"]): json.loads(r["value"])
                      for r in rows if r["stage"] == stage}
            assert landed == history, stage
            found, overlaps = stored_windows(store, stage)
            assert overlaps == 0
            assert found == truth[stage], stage  # and the store itself is exact
            assert all(Counter(v) == truth[stage][slot] for slot, v in landed.items())
    finally:
        store.close()
    print(f"landing: {len(rows)} rows in {len(after)} files, {len(before)} rows before the "
          f"kill; minute windows closed {sum(1 for r in rows if r['stage'] == MINUTE_STAGE)}")

    # The streaming follower over the same zone: counters equal the zone's sums, and a
    # second copy of a file (what a replay regrouped into another flush would leave) does
    # not change them.
    updates: list[dict[str, dict[str, Any]]] = []
    checkpoint = tmp_path / "follow-checkpoint"
    follow_stages(spark, landing, STAGES, (), checkpoint, lambda _, c: updates.append(c),
                  once=True)
    want = {}
    for stage in STAGES:
        values = [json.loads(r["value"]) for r in rows if r["stage"] == stage]
        want[stage] = (len(values), sum(v["ok"] for v in values), sum(v["failed"] for v in values))
    assert counted(updates[-1]) == want
    some = next(iter((landing / f"stage={MINUTE_STAGE}").glob("*.parquet")))
    shutil.copy(some, some.with_name("copy-" + some.name))
    follow_stages(spark, landing, STAGES, (), checkpoint, lambda _, c: updates.append(c),
                  once=True)
    assert counted(updates[-1]) == want
    assert len(updates) >= 2

    # `onceflow analytics --source landing` and `--follow --once` from the command line.
    conf = tmp_path / "app.conf"
    conf.write_text(f'onceflow.pipeline = "onceflow.examples.robot_chain:windows"\n'
                    f'onceflow.landing.dir = "{landing}"\n'
                    "onceflow.analytics.spark { master = \"local[2]\", ui-enabled = false }\n")
    out = tmp_path / "cli-out"
    assert analytics_cli(["-c", str(conf), "--source", "landing", "--out", str(out),
                          "--job", "onceflow.examples.robots_report:report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {s: (v["closed_windows"], v["ok"], v["failed"])
            for s, v in summary["stages"].items()} == want
    assert (out / "report.html").exists()
    assert analytics_cli(["-c", str(conf), "--follow", "--once", "--out", str(out)]) == 0
    assert analytics_cli(["-c", str(conf), "--set", "onceflow.analytics.top-n=0"]) == 2


async def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    async with harness.CommittedOffsets(bootstrap, group) as offsets:
        return await offsets.read(topic, range(4))


async def _drained(bootstrap: str, group: str, topic: str, ends: dict[int, int],
                   worker: harness.WorkerProcess) -> None:
    async with harness.CommittedOffsets(bootstrap, group) as committed:
        assert await committed.wait_for(topic, ends, 120, worker), f"see {worker.logs[-1]}"
