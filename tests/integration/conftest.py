"""Integration tests import their shared helpers from this folder; the stores that want
a login and TLS are started here, once per session, for the tests that use them."""

import fcntl
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import SecureService, clean_env  # importable once the folder is on the path

from onceflow.devtools import services
from onceflow.devtools.certs import LocalPki, make_pki

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with ``pip install <sources>`` and no extras (pip's cache makes it quick).

    Built once per run (~90 s) and shared by its tests, also across pytest-xdist workers:
    the first to take the lock builds it in the run's common temporary directory, the others
    wait and use it (xdist_group does not group under pytest 9: xdist sets ``_nodeid``).
    Its tests add nothing to it.
    """
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's directory, above each worker's popen-gwN
    base = shared / "fresh-venv"
    venv, built = base / "venv", base / "built"
    with (shared / "fresh-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not built.exists():
            shutil.rmtree(base, ignore_errors=True)  # a build that failed half-way
            _build_venv(base, venv)
            built.touch()
    return venv


def _build_venv(base: Path, venv: Path) -> None:
    # A copy, so that the build's egg-info and build/ stay out of the worktree.
    source = base / "src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "onceflow", source / "onceflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean_env(),
                   cwd=base, timeout=300)
    started = time.monotonic()
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          str(source)], env=clean_env(), cwd=base, capture_output=True, text=True,
                         timeout=900, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    print(f"pip install onceflow (no extras): {time.monotonic() - started:.1f} s")


@pytest.fixture(scope="session")
def store_pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, for the stores."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def secure_redis_service(tmp_path_factory: pytest.TempPathFactory, store_pki: LocalPki
                         ) -> Iterator[SecureService]:
    """A private Redis on TLS only (client certificates required) with requirepass."""
    admin = "admin-" + uuid.uuid4().hex
    info = services.start_redis(tmp_path_factory.mktemp("redis-secure"), password=admin,
                                tls=store_pki)
    try:
        yield SecureService(info, store_pki, (None, admin))
    finally:
        services.stop(info)


@pytest.fixture(scope="session")
def secure_cassandra_service(tmp_path_factory: pytest.TempPathFactory, store_pki: LocalPki
                             ) -> Iterator[SecureService]:
    """A private Cassandra 2.1 with PasswordAuthenticator and client-to-node TLS (~600 MB:
    one per session)."""
    info = services.start_cassandra(tmp_path_factory.mktemp("cassandra-secure"),
                                    password_auth=True, tls=store_pki)
    try:
        yield SecureService(info, store_pki, services.CASSANDRA_SUPERUSER)
    finally:
        services.stop(info)
