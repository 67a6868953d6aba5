"""The window clocks' rows and the producer-sequence tables, checked as they are read back.

A row that is not what onceflow writes (garbage written by hand, another
program, a damaged copy) would fail deep inside a batch, again after every
restart: a loop. Checked here, as the rows come out of the store, it stops
the worker at once with ``UndecodableState`` naming the stage, the key and
the row, as an undecodable aggregate state does. The rows are read once per
partition (on assignment, or on its first record), so the check costs nothing
per record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from onceflow.stages.producer_dedup import SEQUENCE_STAGE, PartitionSequences
from onceflow.stages.watermark import WINDOWS_STAGE, PartitionWatermark
from onceflow.stores.base import StateStore, UndecodableState

__all__ = [
    "check_sequence_row",
    "check_window_row",
    "checked_sequence_rows",
    "checked_window_rows",
]


def checked_window_rows(store: StateStore, rows: Mapping[str, bytes]) -> Mapping[str, bytes]:
    """``rows`` (of ``WINDOWS_STAGE``) if each decodes; else UndecodableState naming the
    windowed stage (the key's first part), the key and the row."""
    return _checked(store, WINDOWS_STAGE, rows, check_window_row,
                    lambda key: key.rsplit("|", 3)[0], "window clock row")


def checked_sequence_rows(store: StateStore, rows: Mapping[str, bytes]) -> Mapping[str, bytes]:
    """``rows`` (of ``SEQUENCE_STAGE``) if each decodes; else UndecodableState naming
    ``SEQUENCE_STAGE``, the key (``<topic>|<partition>``) and the row."""
    return _checked(store, SEQUENCE_STAGE, rows, check_sequence_row,
                    lambda key: SEQUENCE_STAGE, "producer sequence table")


def check_window_row(key: str, row: bytes) -> None:
    """Raise unless ``row`` is what ``window_clock`` writes under ``key``
    (``<stage>|wm|<topic>|<partition>``: a watermark; ``<stage>|open|...``: the keys with
    open windows)."""
    kind = key.rsplit("|", 3)[1] if key.count("|") >= 3 else None
    doc = json.loads(row)
    if kind == "wm":
        mark = PartitionWatermark.decode(row, 0)
        roots, value, held = doc["r"], mark.value, mark.held_until
        _expect(all(isinstance(t, str) and _int(p) and _int(ts) for t, p, ts in roots),
                f"roots {roots!r} are not [topic, partition, event time] triples")
        _expect(value is None or _int(value), f"watermark {value!r} is not an integer")
        _expect(held is None or _int(held), f"held-until {held!r} is not an integer")
    elif kind == "open":
        _expect(isinstance(doc, list) and all(isinstance(k, str) for k in doc),
                f"{doc!r} is not a list of keys")
    else:
        raise ValueError(f"key {key!r} is neither a watermark nor an open-windows row")


def check_sequence_row(key: str, row: bytes) -> None:
    """Raise unless ``row`` is a producer-sequence table as ``producer_dedup`` writes it."""
    table = PartitionSequences.decode(row)
    _expect(_int(table.next_offset) and _int(table.duplicates),
            f"next offset {table.next_offset!r} or duplicates {table.duplicates!r} is not "
            "an integer")
    for producer, entry in table.producers.items():
        _expect(isinstance(entry, list) and len(entry) == 3 and all(map(_int, entry)),
                f"producer {producer!r}: {entry!r} is not [epoch, sequence, offset]")


def _checked(store: StateStore, namespace: str, rows: Mapping[str, bytes],
             check: Callable[[str, bytes], None], stage_of: Callable[[str], str],
             what: str) -> Mapping[str, bytes]:
    for key, row in rows.items():
        try:
            check(key, row)
        except Exception as error:
            raise UndecodableState(stage_of(key), key, store.row_name(namespace, key),
                                   ValueError(f"not a onceflow {what}: "
                                              f"{type(error).__name__}: {error}")) from error
    return rows


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise TypeError(problem)
