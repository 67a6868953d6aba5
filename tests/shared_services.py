"""One Cassandra for all of ``make test``'s pytest processes, not one per process.

``make test`` runs the suite in several pytest processes side by side (pytest-xdist's
workers and the Spark lane). Each started its own Cassandra (and the TLS one): six JVMs of
~600 MB that cost 477 s of CPU in one run, most of it start-up and idling. When the
Makefile names a folder in ``ONCEFLOW_TEST_SHARED_SERVICES``, the first process to want a
service starts it there (the others wait on a file lock) and every process uses that
one; tests never share a keyspace (``unique_name``). The Makefile stops them when the
processes are done (``python tests/shared_services.py stop DIR``). Without the variable
(a plain ``pytest``) each process starts its own, as before.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from onceflow.devtools import services
from onceflow.devtools.services import ServiceInfo

ENV = "ONCEFLOW_TEST_SHARED_SERVICES"
T = TypeVar("T")


def shared_folder() -> Path | None:
    """The run's folder of shared services, None when each process starts its own."""
    folder = os.environ.get(ENV)
    return Path(folder) if folder else None


def shared(name: str, start: Callable[[Path], T]) -> T:
    """The run's ``name``, started by ``start(folder)`` in the first process that asks.

    A start that fails raises here (the test fails with the reason) and leaves no record,
    so the next process tries again rather than meeting a half-started service."""
    root = shared_folder()
    assert root is not None, f"{ENV} is not set"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        record = root / f"{name}.pickle"
        if record.exists():
            value: T = pickle.loads(record.read_bytes())
            return value
        folder = root / name
        folder.mkdir(exist_ok=True)  # a failed start may have left it
        value = start(folder)
        info = value if isinstance(value, ServiceInfo) else getattr(value, "info", None)
        if isinstance(info, ServiceInfo):  # a service (or a SecureService): to stop at the end
            (root / f"{name}.service").write_bytes(pickle.dumps(info))
        record.write_bytes(pickle.dumps(value))
        return value


def stop_all(root: Path) -> None:
    """Stop every service started in ``root``, then remove it."""
    for record in sorted(root.glob("*.service")):
        services.stop(pickle.loads(record.read_bytes()))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "stop":
        sys.exit("usage: python tests/shared_services.py stop DIR")
    stop_all(Path(sys.argv[2]))
