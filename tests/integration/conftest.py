"""Integration tests import their shared helpers from this folder; the stores that want
a login and TLS are started here, once per session, for the tests that use them."""

import base64
import csv
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import SecureService, clean_env  # importable once the folder is on the path

from onceflow import compiled
from onceflow.devtools import services
from onceflow.devtools.certs import LocalPki, make_pki

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the built wheel installed (``pip install onceflow-*.whl``), no extras.

    The wheel is ``make setup``'s in ``dist/`` (compiled where a C compiler is present)
    when it holds today's sources, else one built now. Built once per run (15-30 s; pip's
    cache makes it quick) and shared by its tests, also across pytest-xdist workers: the
    first to take the lock builds it in the run's common temporary directory, the others
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


def current_wheel(out: Path) -> Path:
    """``dist/``'s wheel if it holds the package's files as they are now, else one built
    into ``out`` (with the in-place build's C and objects: quick when the record path is
    unchanged)."""
    for wheel in (ROOT / "dist").glob("onceflow-*.whl"):
        if not outdated(wheel):
            return wheel
    started = time.monotonic()
    wheel = compiled.build_wheel(out)
    print(f"built {wheel.name}: {time.monotonic() - started:.1f} s")
    return wheel


def outdated(wheel: Path) -> list[str]:
    """The package's sources whose content differs between the checkout and the wheel."""
    packaged = (".py", ".pyi", ".conf", ".tmpl", ".proto", ".typed")
    here = {str(path.relative_to(ROOT)): _record_hash(path.read_bytes())
            for path in (ROOT / "onceflow").rglob("*")
            if path.is_file() and path.suffix in packaged and "__pycache__" not in path.parts}
    with zipfile.ZipFile(wheel) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(archive.read(record).decode().splitlines())
        packed = {row[0]: row[1] for row in rows
                  if row[0].startswith("onceflow/") and row[0].endswith(packaged)}
    return sorted(p for p in here.keys() | packed.keys() if here.get(p) != packed.get(p))


def _record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _build_venv(base: Path, venv: Path) -> None:
    base.mkdir(parents=True)
    wheel = current_wheel(base / "dist")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean_env(),
                   cwd=base, timeout=300)
    started = time.monotonic()
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          str(wheel)], env=clean_env(), cwd=base, capture_output=True, text=True,
                         timeout=900, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    (base / "wheel").write_text(wheel.name)
    print(f"pip install {wheel.name} (no extras): {time.monotonic() - started:.1f} s")


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
