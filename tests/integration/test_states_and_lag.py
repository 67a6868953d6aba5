"""Reading a pipeline without Spark: ``onceflow status`` lag from Kafka (before a worker
runs, and ``--wait`` until caught up), then ``onceflow.read_states`` and ``onceflow
states`` against what the worker wrote to Redis (non-windowed) and Cassandra (windowed)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import onceflow
from onceflow.devtools import harness
from onceflow.devtools.chaos import expected_windows
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.examples.robot_chain import MINUTE_STAGE
from onceflow.stages.state import decode_state
from onceflow.stores.base import StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore

APP = '''
import os

from onceflow.examples.robots import count, fastenings, new_counts
from onceflow.stages import Pipeline, Tumbling

pipeline = (
    Pipeline("inspect", topics=(os.environ["INSPECT_TOPIC"],), format="json")
    .flat_map("fastenings", fastenings)
    .aggregate("per_robot", key=lambda f: f.robot, init=new_counts, fold=count)
    .aggregate("per_minute", key=lambda f: f.robot, init=new_counts, fold=count,
               window=Tumbling(60_000, event_time_ms=lambda f: f.ts), store="cassandra")
)
'''


def onceflow_cli(env: dict[str, str], *argv: str, timeout: float = 180
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "onceflow", *argv], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


def lag_lines(result: subprocess.CompletedProcess[str]) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {row["partition"]: row for row in rows}


def scanned(store: StateStore, stage: str) -> dict[str, Any]:
    """The store's rows decoded by hand: key -> value (the worker's encoding)."""
    try:
        return {key: decode_state(value).value for key, value in store.scan(stage)}
    finally:
        store.close()


def as_set(rows: Sequence[dict[str, Any]]) -> set[str]:
    return {json.dumps(row, sort_keys=True) for row in rows}


def test_status_lag_and_read_states_equal_what_the_worker_persisted(
        kafka_service: ServiceInfo, redis_service: ServiceInfo,
        cassandra_service: ServiceInfo, tmp_path: Path, unique_name: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap = kafka_service.address
    topic, prefix, keyspace = unique_name("inspect"), unique_name("p"), unique_name("ks")
    redis_url = f"redis://{redis_service.address}/0"
    app = tmp_path / "app"
    app.mkdir()
    (app / "inspect_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(app))
    monkeypatch.setenv("INSPECT_TOPIC", topic)
    conf = tmp_path / "app.conf"
    conf.write_text(textwrap.dedent(f'''\
        onceflow.pipeline = "inspect_app:pipeline"
        onceflow.kafka {{ bootstrap-servers = "{bootstrap}", group-id = "{unique_name("g")}",
                         session-timeout = 6s, heartbeat-interval = 2s }}
        onceflow.persistence.interval = 500ms
        onceflow.commit.interval = 1s
        onceflow.windows.idle-timeout = 10s  # the first start closes windows after this
        onceflow.stores.redis {{ url = "{redis_url}", key-prefix = "{prefix}" }}
        onceflow.stores.cassandra {{ contact-points = ["{cassandra_service.host}"],
            port = {cassandra_service.port}, keyspace = "{keyspace}", protocol-version = 3 }}
        '''))
    env = {**os.environ, "INSPECT_TOPIC": topic,
           "PYTHONPATH": os.pathsep.join([str(app), os.environ.get("PYTHONPATH", "")])}
    stream = generate(3_000, robots=40, seed=41)  # in order: nothing is late
    asyncio.run(harness.create_topic(bootstrap, topic, 4))
    ends = asyncio.run(harness.produce(bootstrap, topic, stream.messages))
    assert len(ends) == 4 and sum(ends.values()) == 3_000

    # No worker has run: the whole topic is lag, and --wait gives up.
    before = onceflow_cli(env, "status", "-c", str(conf), "--json")
    assert before.returncode == 0, before.stderr
    assert lag_lines(before) == {
        p: {"group": lag_lines(before)[p]["group"], "topic": topic, "partition": p,
            "committed": None, "end": end, "lag": end} for p, end in ends.items()}
    table = onceflow_cli(env, "status", "-c", str(conf))
    assert f"lag {sum(ends.values())} over 4 partitions" in table.stdout, table.stderr
    gave_up = onceflow_cli(env, "status", "-c", str(conf), "--wait", "--timeout", "2")
    assert gave_up.returncode == 1 and "not caught up after 2s: lag 3000" in gave_up.stderr

    worker = harness.WorkerProcess([sys.executable, "-m", "onceflow", "run", "-c", str(conf)],
                                   env, tmp_path)
    worker.start()
    try:
        caught_up = onceflow_cli(env, "status", "-c", str(conf), "--wait", "--timeout", "150",
                                 "--json")
        assert caught_up.returncode == 0, (caught_up.stderr, worker.logs[-1].read_text()[-3000:])
        assert {p: (r["committed"], r["end"], r["lag"]) for p, r in
                lag_lines(caught_up).items()} == {p: (end, end, 0) for p, end in ends.items()}
    finally:
        assert worker.terminate(timeout=30) == 0

    # read_states equals the rows the worker wrote, decoded by hand, and the truth.
    truth = {robot: {"ok": c["ok"], "failed": c["failed"]} for robot, c in stream.truth.items()}
    plain = onceflow.read_states(conf, "per_robot")
    assert plain == sorted(({"stage": "per_robot", "key": k, "value": v}
                            for k, v in scanned(RedisStore(redis_url, prefix, "inspect"),
                                                "per_robot").items()),
                           key=lambda row: row["key"])
    assert {row["key"]: row["value"] for row in plain} == truth

    def cassandra() -> CassandraStore:
        return CassandraStore([cassandra_service.host], "inspect", port=cassandra_service.port,
                              keyspace=keyspace, protocol_version=3)

    opened = onceflow.read_states(conf, "per_minute")
    stored_open = {(k, int(s)): v for k, state in scanned(cassandra(), "per_minute").items()
                   for s, v in state["open"].items()}
    assert {(r["key"], r["window_start"]): r["value"] for r in opened} == stored_open
    assert all(not r["closed"] and r["window_end"] == r["window_start"] + 60_000 for r in opened)
    history_store = cassandra()
    try:
        stored_closed = {(k, s): json.loads(v) for k, s, v in
                         history_store.scan_history("per_minute")}
    finally:
        history_store.close()
    assert stored_open and stored_closed  # both kinds exist: the check below covers both
    every = onceflow.read_states(conf, "per_minute", history=True)
    assert {(r["key"], r["window_start"]): (r["closed"], r["value"]) for r in every} == {
        **{w: (False, v) for w, v in stored_open.items()},
        **{w: (True, v) for w, v in stored_closed.items()}}
    minutes = expected_windows(stream)[0][MINUTE_STAGE]  # every event in its minute
    assert {(r["key"], r["window_start"]): r["value"] for r in every} == {
        slot: {"ok": c["ok"], "failed": c["failed"]} for slot, c in minutes.items()}
    robot = plain[0]["key"]
    assert onceflow.read_states(conf, "per_minute", robot, history=True) == [
        r for r in every if r["key"] == robot]

    # The CLI prints the same rows as JSON lines.
    lines = onceflow_cli(env, "states", "-c", str(conf), "per_robot")
    assert lines.returncode == 0, lines.stderr
    assert as_set([json.loads(line) for line in lines.stdout.splitlines()]) == as_set(plain)
    lines = onceflow_cli(env, "states", "-c", str(conf), "per_minute", robot, "--history")
    assert sorted((json.loads(line) for line in lines.stdout.splitlines()),
                  key=lambda r: r["window_start"]) == [r for r in every if r["key"] == robot]
    wrong = onceflow_cli(env, "states", "-c", str(conf), "per_hour")
    assert wrong.returncode == 2 and ("pipeline 'inspect' has no aggregate 'per_hour' "
                                      "(it has per_robot, per_minute)") in wrong.stderr
