"""Fault injection for tests: kill the process at exact points, set by a test-only entry point.

Random SIGKILLs prove the common cases; these points make the rare ones
certain: a crash between persisting two stages, or in the middle of one
input's fan-out. All are off in a production worker: ``onceflow run`` never
reads them (it refuses to start while an ``ONCEFLOW_FAULT_*`` variable is
set, so a stray one is never silent). Only ``python -m
onceflow.devtools.fault_worker run ...`` (the test harness's worker) reads
them, through ``configure``, and logs a WARNING per active switch. Off,
they cost one attribute check.

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
- ``ONCEFLOW_FAULT_NO_FENCING=1``: snapshot writes carry no epochs, Cassandra
  orders rows by the clock, not by epoch, and exclusive outputs are produced
  without checking the epochs (wrong on purpose, to show what fencing
  prevents: a paused worker's stale states then overwrite its successor's,
  and its in-hand outputs are written twice).
- ``ONCEFLOW_FAULT_FETCH_FAILS_AFTER=<n>``: the process's first consumer stream fails
  (its fetch loop raises) right after handing its ``n``-th batch to the pipeline, once:
  the stream the supervisor re-creates runs on.
- ``ONCEFLOW_FAULT_NO_MERGE_LOG=1``: joins apply their inputs in arrival order, unlogged,
  each value meeting the newest row, and a single worker its source partitions (wrong on
  purpose, to show what the merge log fixes: a replay meets another version of the
  table than the first run, or closes a window at another point).
- ``ONCEFLOW_FAULT_STAGE_RAISES_ON=<text>``: the pipeline actor raises on every
  batch holding a record whose bytes contain ``text``, as a bug in the
  runtime would: the supervisor restarts it until the budget is gone.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import NoReturn

PREFIX = "ONCEFLOW_FAULT_"
SWITCHES = ("KILL_AFTER_SAVE", "UPSTREAM_FIRST", "KILL_AFTER_LANDING", "KILL_AFTER_SENDS",
            "NO_FENCING", "PRODUCE_FAILS", "STAGE_RAISES_ON", "FETCH_FAILS_AFTER", "NO_MERGE_LOG")

KILL_AFTER_SAVE: str | None = None
UPSTREAM_FIRST = False
KILL_AFTER_LANDING = False
KILL_AFTER_SENDS = 0
NO_FENCING = False
PRODUCE_FAILS: str | None = None
STAGE_RAISES_ON = b""
FETCH_FAILS_AFTER = 0
NO_MERGE_LOG = False
_fetched = 0  # batches handed over while FETCH_FAILS_AFTER is armed


class InjectedFailure(RuntimeError):
    """Raised where a fault point says so; never caught as a record error."""


class UnknownSwitch(ValueError):
    """An ``ONCEFLOW_FAULT_*`` name that is not a switch (a typo would be silently off)."""


def set_in(environ: Mapping[str, str]) -> list[str]:
    """The ``ONCEFLOW_FAULT_*`` variables set in ``environ`` (any value), sorted."""
    return sorted(name for name in environ if name.startswith(PREFIX))


def configure(environ: Mapping[str, str]) -> dict[str, str]:
    """Set the switches from ``environ``; answers the active ones (name -> value).

    Test-only (``onceflow.devtools.fault_worker``); an empty value is off.
    """
    global KILL_AFTER_SAVE, UPSTREAM_FIRST, KILL_AFTER_LANDING, KILL_AFTER_SENDS
    global NO_FENCING, PRODUCE_FAILS, STAGE_RAISES_ON, FETCH_FAILS_AFTER, NO_MERGE_LOG
    unknown = [name for name in set_in(environ) if name[len(PREFIX):] not in SWITCHES]
    if unknown:
        raise UnknownSwitch(f"unknown fault switch {', '.join(unknown)} (known: "
                            f"{', '.join(PREFIX + s for s in SWITCHES)})")

    def get(switch: str) -> str:
        return environ.get(PREFIX + switch, "")

    KILL_AFTER_SAVE = get("KILL_AFTER_SAVE") or None
    UPSTREAM_FIRST = get("UPSTREAM_FIRST") == "1"
    KILL_AFTER_LANDING = get("KILL_AFTER_LANDING") == "1"
    KILL_AFTER_SENDS = int(get("KILL_AFTER_SENDS") or 0)
    NO_FENCING = get("NO_FENCING") == "1"
    PRODUCE_FAILS = get("PRODUCE_FAILS") or None
    STAGE_RAISES_ON = get("STAGE_RAISES_ON").encode()
    FETCH_FAILS_AFTER = int(get("FETCH_FAILS_AFTER") or 0)
    NO_MERGE_LOG = get("NO_MERGE_LOG") == "1"
    return {PREFIX + s: get(s) for s in SWITCHES if get(s)}


def fetch_fails() -> bool:
    """A batch was handed over: True once, at the ``FETCH_FAILS_AFTER``-th."""
    global _fetched
    _fetched += 1
    return _fetched == FETCH_FAILS_AFTER


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)  # not reached
