"""The README's quickstart, followed as printed by ``onceflow new``, in a fresh venv.

``onceflow new`` from a plain install (so its templates must be package data),
the generated test with ``python -m pytest``, the generated scripts creating the
topics and sending payments with re-sent copies, a worker on the generated
config, ``onceflow status --wait`` and ``onceflow states``: the totals equal
the topic's distinct payments. The services are the session's; the config is
pointed at them by the two variables the README names.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from helpers import clean_env, consume_all, exit_code_within

from onceflow.devtools.services import ServiceInfo, free_port

PAYMENTS = 400


def run(venv: Path, argv: list[str], cwd: Path, env: Mapping[str, str],
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``argv[0]`` from the venv's bin (python, onceflow); fails the test on a non-zero exit."""
    done = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=dict(env),
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done


def truth(records: list[object]) -> dict[str, dict[str, int]]:
    """Per-merchant count and amount over the distinct (merchant, seq) payments read back."""
    distinct: dict[tuple[str, int], int] = {}
    for record in records:
        payment = json.loads(record.value)  # type: ignore[attr-defined]
        distinct[(payment["merchant"], payment["seq"])] = payment["amount"]
    totals: dict[str, dict[str, int]] = {}
    for (merchant, _), amount in distinct.items():
        total = totals.setdefault(merchant, {"count": 0, "amount": 0})
        total["count"] += 1
        total["amount"] += amount
    return totals


@pytest.mark.timeout(900)
def test_the_quickstart_runs_as_onceflow_new_prints_it(
    fresh_venv: Path, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
) -> None:
    name = f"pay_{uuid.uuid4().hex[:8]}"  # the topic, group and key prefix: this test's own
    env = clean_env(ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS=kafka_service.address,
                    ONCEFLOW_REDIS_URL=f"redis://{redis_service.address}/0")
    printed = run(fresh_venv, ["onceflow", "new", name], tmp_path, env).stdout
    project = tmp_path / name
    assert f"onceflow run -c {name}.conf" in printed

    # `pip install pytest`, beside the venv so the plain install stays plain for test_install.
    tools = tmp_path / "tools"
    run(fresh_venv, ["python", "-m", "pip", "install", "--quiet", "--target", str(tools),
                     "pytest"], tmp_path, env, timeout=300)
    tested = run(fresh_venv, ["python", "-m", "pytest", "-q", "tests"], project,
                 {**env, "PYTHONPATH": str(tools)})
    assert "1 passed" in tested.stdout

    run(fresh_venv, ["python", "create_topics.py"], project, env)
    port = free_port()
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [str(fresh_venv / "bin" / "onceflow"), "run", "-c", f"{name}.conf",
             "--set", f"onceflow.metrics.port={port}"],  # 9464 may be taken on a shared host
            cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        sent = run(fresh_venv, ["python", "send_payments.py", str(PAYMENTS)], project, env)
        copies = int(re.fullmatch(rf"sent {PAYMENTS} payments to {name} and (\d+) re-sent "
                                  r"copies\n", sent.stdout).group(1))  # type: ignore[union-attr]
        assert copies > 0  # 5% of 400: none at all has a chance of 1e-9
        waited = run(fresh_venv, ["onceflow", "status", "-c", f"{name}.conf", "--wait",
                                  "--timeout", "90"], project, env)
        assert f"group {name}: lag 0 over 4 partitions" in waited.stdout, waited.stdout
        expected = truth(consume_all(kafka_service.address, name, PAYMENTS + copies))
        assert sum(t["count"] for t in expected.values()) == PAYMENTS

        rows = run(fresh_venv, ["onceflow", "states", "-c", f"{name}.conf", "per_merchant"],
                   project, env).stdout.splitlines()
        assert {row["key"]: row["value"] for row in map(json.loads, rows)} == expected
        health = run(fresh_venv, ["onceflow", "status", "--url", f"http://127.0.0.1:{port}"],
                     project, env)
        assert "worker: healthy" in health.stdout
        worker.send_signal(signal.SIGTERM)
        assert exit_code_within(worker, 60, log, "no exit after SIGTERM") == 0, \
            log.read_text(errors="replace")[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
