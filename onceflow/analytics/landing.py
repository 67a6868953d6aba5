"""The Parquet landing zone: closed windows and state changes handed to Spark as files.

Layout: ``<dir>/stage=<stage id>/<pipeline>-<stage>-w<first start>-<digest>.parquet``,
one file per flush and windowed stage that closed windows, with the columns
``pipeline, key, window_start, value`` (``value`` is the window's final value
as JSON) and, in the file's metadata, the input offsets the flush made
durable. Spark and pyarrow read ``stage`` from the directory name.

A non-windowed aggregate has no closed windows: its history is the states
each flush wrote, ``<pipeline>-<stage>-s<digest>.parquet`` with
``window_start`` null, ``value`` the state's value, and ``progress``: the
sum of the root offsets the state has folded (its watermarks). A key's
progress grows with every write of it, so its latest row is the one with
the highest progress (``written_ms``, the write's wall-clock time, breaks
ties and dates the row). The file is written before the states, like a
window's: a crash in between leaves a row of a state the store never held,
but one that a real prefix of the input folds to, and the replay writes
the key again with at least that progress.

Idempotency rests on two facts:

* The file is written by the persistence actor after the stage's history
  rows and before the stage's states (which no longer hold those windows),
  and before the flush's offsets can be committed: a committed offset
  implies its files exist, and a crash before the states are written
  replays the windows' closing (nothing is lost from the zone).
* A closed window's value is final, and the file's name is derived from the
  windows it holds (stage and the sorted (key, start) set): writing the same
  windows again replaces the file (temp file + ``os.replace``, so a reader
  never sees half a file) instead of adding rows.

A crash after all of a flush's writes (the usual case: between the file and
the commit) replays records whose effects are already in the states: the
windows do not close again and no file is written twice. Only a crash
between a stage's file and its state write, followed by a replay that groups
the closing records into different flushes, leaves a second, equal copy of
a window in another file; readers therefore deduplicate on
(stage, key, window_start), which keeps any copy (they are equal).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.stages.state import decode_state

__all__ = ["LANDING_SCHEMA", "STATES_SCHEMA", "LandingZone", "file_name", "read_landing",
           "states_file_name"]

LANDING_SCHEMA = pa.schema([
    ("pipeline", pa.string()),
    ("key", pa.string()),
    ("window_start", pa.int64()),
    ("value", pa.string()),
])
#: A non-windowed stage's rows: the states a flush wrote (module docstring).
STATES_SCHEMA = pa.schema([*LANDING_SCHEMA, ("progress", pa.int64()), ("written_ms", pa.int64())])
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def file_name(pipeline_id: str, stage_id: str, windows: Mapping[tuple[str, int], bytes]) -> str:
    """The file's name: a function of the stage and the (key, start) pairs it holds."""
    digest = hashlib.sha256()
    for key, start in sorted(windows):
        digest.update(f"{start}|{key}\n".encode())
    first = min(start for _, start in windows)
    return (f"{_SAFE.sub('_', pipeline_id)}-{_SAFE.sub('_', stage_id)}"
            f"-w{first}-{digest.hexdigest()[:20]}.parquet")


def states_file_name(pipeline_id: str, stage_id: str, states: Mapping[str, bytes]) -> str:
    """A states file's name: a function of the stage and the encoded states it holds."""
    digest = hashlib.sha256()
    for key in sorted(states):
        digest.update(f"{len(key)}|{key}|".encode() + states[key] + b"\n")
    return (f"{_SAFE.sub('_', pipeline_id)}-{_SAFE.sub('_', stage_id)}"
            f"-s{digest.hexdigest()[:24]}.parquet")


class LandingZone:
    """Writes one pipeline's closed windows, and the states its non-windowed aggregates
    (``plain``) write, under ``root``; used by one thread."""

    def __init__(self, root: str | Path, pipeline_id: str, plain: Iterable[str] = ()):
        self.root = Path(root)
        self.pipeline_id = pipeline_id
        self.plain = frozenset(plain)

    def write_states(self, stage_id: str, states: Mapping[str, bytes],
                     offsets: Mapping[Any, int]) -> Path | None:
        """Write the encoded states of one flush of a non-windowed stage; atomically.
        None when the stage is windowed (or not an aggregate) or nothing was written."""
        if stage_id not in self.plain or not states:
            return None
        written_ms = time.time_ns() // 1_000_000
        rows = []
        for key in sorted(states):
            state = decode_state(states[key])
            rows.append((key, json.dumps(state.value, separators=(",", ":")),
                         sum(int(position[0]) for position in state.watermarks.values())))
        table = pa.table({
            "pipeline": [self.pipeline_id] * len(rows),
            "key": [key for key, _, _ in rows],
            "window_start": pa.nulls(len(rows), pa.int64()),
            "value": [value for _, value, _ in rows],
            "progress": [progress for _, _, progress in rows],
            "written_ms": [written_ms] * len(rows),
        }, schema=STATES_SCHEMA)
        return self._put(stage_id, table, states_file_name(self.pipeline_id, stage_id, states),
                         offsets)

    def write(self, stage_id: str, windows: Mapping[tuple[str, int], bytes],
              offsets: Mapping[Any, int]) -> Path | None:
        """Write the windows ``(key, start) -> final value JSON`` of one flush; atomically.

        ``offsets`` (topic partition -> next offset) go into the file's
        metadata, for tracing a file back to the input it covers. Returns the
        file's path, or None when there was nothing to write.
        """
        if not windows:
            return None
        rows = sorted(windows.items(), key=lambda item: (item[0][1], item[0][0]))
        table = pa.table({
            "pipeline": [self.pipeline_id] * len(rows),
            "key": [key for (key, _), _ in rows],
            "window_start": [start for (_, start), _ in rows],
            "value": [value.decode() for _, value in rows],
        }, schema=LANDING_SCHEMA)
        return self._put(stage_id, table, file_name(self.pipeline_id, stage_id, windows), offsets)

    def _put(self, stage_id: str, table: pa.Table, name: str, offsets: Mapping[Any, int]
             ) -> Path:
        """Write ``table`` as ``stage=<stage_id>/<name>``: temp file, fsync, rename."""
        folder = self.root / f"stage={stage_id}"
        folder.mkdir(parents=True, exist_ok=True)
        durable = {f"{tp[0]}:{tp[1]}": offset for tp, offset in offsets.items()}
        table = table.replace_schema_metadata({
            "onceflow.stage": stage_id,
            "onceflow.offsets": json.dumps(durable, sort_keys=True),
        })
        final = folder / name
        # Names starting with "." are ignored by Spark and pyarrow: a crash
        # mid-write leaves a temp file nobody reads (the next write of the
        # same windows replaces the final name, never the temp one).
        temp = folder / f".{final.name}.{os.getpid()}.tmp"
        with temp.open("wb") as out:
            pq.write_table(table, out, compression="snappy")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, final)
        _fsync_dir(folder)
        return final


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_landing(root: str | Path) -> list[dict[str, Any]]:
    """Every row of the landing zone (duplicates included), without Spark; for tests
    and small tools. Each row: stage, pipeline, key, window_start, value, file, and
    for states (non-windowed stages) progress and written_ms."""
    rows: list[dict[str, Any]] = []
    for path in sorted(Path(root).glob("stage=*/*.parquet")):
        if path.name.startswith((".", "_")):
            continue
        stage = path.parent.name.partition("=")[2]
        for row in pq.read_table(path).to_pylist():
            rows.append({"stage": stage, **row, "file": path.name})
    return rows
