"""Fault injection for tests: kill the process at exact points, set by environment.

Random SIGKILLs prove the common cases; these points make the rare ones
certain: a crash between persisting two stages, or in the middle of one
input's fan-out. Unset (the default) they cost one attribute check.

- ``ONCEFLOW_FAULT_KILL_AFTER_SAVE=<stage id>``: SIGKILL right after that
  stage's states are written, before any other stage of the same snapshot.
- ``ONCEFLOW_FAULT_UPSTREAM_FIRST=1``: persist upstream stages first (wrong on
  purpose, to show what the downstream-first order prevents).
- ``ONCEFLOW_FAULT_KILL_AFTER_LANDING=1``: SIGKILL right after a snapshot that
  wrote landing-zone files has written all its states and files, before its
  offsets can be committed.
- ``ONCEFLOW_FAULT_KILL_AFTER_SENDS=<n>``: SIGKILL once ``n`` produced records
  are settled (acknowledged, or in the outbox); records after them are never sent.
- ``ONCEFLOW_FAULT_PRODUCE_FAILS=<topic>``: every send to that topic fails as
  if its leader were unreachable, so its records go to the outbox and stay.
- ``ONCEFLOW_FAULT_NO_FENCING=1``: snapshot writes carry no epochs, and
  Cassandra orders rows by the clock, not by epoch (wrong on purpose, to show
  what fencing prevents: a paused worker's stale states then overwrite its
  successor's).
- ``ONCEFLOW_FAULT_STAGE_RAISES_ON=<text>``: the pipeline actor raises on every
  batch holding a record whose bytes contain ``text``, as a bug in the
  runtime would: the supervisor restarts it until the budget is gone.
"""

from __future__ import annotations

import os
import signal
from typing import NoReturn

KILL_AFTER_SAVE = os.environ.get("ONCEFLOW_FAULT_KILL_AFTER_SAVE") or None
UPSTREAM_FIRST = os.environ.get("ONCEFLOW_FAULT_UPSTREAM_FIRST") == "1"
KILL_AFTER_LANDING = os.environ.get("ONCEFLOW_FAULT_KILL_AFTER_LANDING") == "1"
KILL_AFTER_SENDS = int(os.environ.get("ONCEFLOW_FAULT_KILL_AFTER_SENDS") or 0)
NO_FENCING = os.environ.get("ONCEFLOW_FAULT_NO_FENCING") == "1"
PRODUCE_FAILS = os.environ.get("ONCEFLOW_FAULT_PRODUCE_FAILS") or None
STAGE_RAISES_ON = os.environ.get("ONCEFLOW_FAULT_STAGE_RAISES_ON", "").encode()


class InjectedFailure(RuntimeError):
    """Raised where a fault point says so; never caught as a record error."""


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)  # not reached
