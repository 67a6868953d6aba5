"""A crash loop while records wait: /health says so with the group's real lag, then it stops.

The pipeline actor fails on every batch (a fault switch, as a runtime bug
would), so the core restarts and nothing is ever committed. The old worker
answered /health from its own counters (lag 0, healthy between two
restarts) and, its backoff keeping failures under the restart budget,
looped for ever. Now /health is 503 with the loop as the reason and the lag
``onceflow status`` reads from Kafka (and status prints the same verdict),
and the same failure ``supervision.max-repeats`` times in a row stops the
worker with exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import committed, create_topic, produce

from onceflow.devtools import harness, services
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo

REPEATS = 5


def health(port: int) -> tuple[int, dict[str, Any]] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
    except OSError:  # not listening yet, or gone
        return None


def test_a_crash_loop_is_503_with_the_real_lag_then_escalates(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    create_topic(kafka_service.address, topic, 2)
    ends = produce(kafka_service.address, topic, generate(1_000, seed=21).messages)
    port = services.free_port()
    config = tmp_path / "app.conf"
    config.write_text(
        f'include file("{harness.packaged_config("demo.conf")}")\n'
        "onceflow {\n"
        f'  kafka {{ bootstrap-servers = "{kafka_service.address}", group-id = "{group}" }}\n'
        f'  stores.redis {{ url = "redis://{redis_service.address}/0", '
        f'key-prefix = "{prefix}" }}\n'
        f"  metrics {{ port = {port}, lag-interval = 500ms }}\n"
        # A budget the loop never exhausts: only max-repeats can stop it.
        "  supervision { max-restarts = 1000, within = 1h, backoff { initial = 1s, max = 1s,"
        # The grace keeps /health up a while after the escalation, for status to ask.
        f" jitter = 0s }}, max-repeats = {REPEATS}, escalation-grace = 10s }}\n"
        "}\n")
    monkeypatch.setenv("ONCEFLOW_ROBOTS_TOPIC", topic)
    monkeypatch.setenv("ONCEFLOW_FAULT_STAGE_RAISES_ON", '"serial":')  # every batch fails
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        argv = harness.fault_aware(harness.worker_command(config, {}), os.environ)
        worker = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, seen = time.monotonic() + 120, None
        while time.monotonic() < deadline and worker.poll() is None:
            answer = health(port)
            if answer is not None and answer[1]["restart_loop"] and answer[1]["lag"]:
                seen = answer
                break
            time.sleep(0.2)
        assert seen is not None, log.read_text()[-3000:]
        code, report = seen
        assert code == 503 and not report["healthy"], report
        assert any(reason.startswith("restart loop: core failed") for reason in
                   report["reasons"]), report
        status = subprocess.run([sys.executable, "-m", "onceflow", "status", "-c", str(config),
                                 "--json"], capture_output=True, text=True, timeout=60,
                                check=False, env=os.environ)
        rows = [json.loads(line) for line in status.stdout.splitlines()
                if line.startswith('{"group"')]
        assert rows, status.stdout + status.stderr
        status_lag = sum(row["lag"] for row in rows)
        # Nothing is ever committed: both read every produced record as lag.
        assert report["lag"] == status_lag == sum(ends.values()), (report, rows)
        # And status says what /health says, its exit code too (the loop, or already its
        # escalation: "escalated: core: RestartLoop: child core failed ...").
        verdict = [line for line in status.stdout.splitlines() if line.startswith("worker: ")]
        assert verdict and verdict[0].startswith("worker: unhealthy: "), status.stdout
        assert "core failed" in verdict[0] and status.returncode == 1, verdict

        assert worker.wait(timeout=120) == 1, log.read_text()[-3000:]
        text = log.read_text()
        assert f"failed {REPEATS} times in a row" in text and "restart loop" in text, text[-3000:]
        assert committed(kafka_service.address, group, topic, 2) == {0: 0, 1: 0}
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
