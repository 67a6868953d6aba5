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
    open windows). The document is checked before it is decoded, so the reason is the
    same whether the decoder runs compiled (type checks of its own) or pure."""
    kind = key.rsplit("|", 3)[1] if key.count("|") >= 3 else None
    doc = json.loads(row)
    if kind == "wm":
        _expect(isinstance(doc, dict), f"{doc!r} is not an object")
        roots, value, held = doc["r"], doc["v"], doc.get("h")
        _expect(isinstance(roots, list) and all(
            isinstance(root, list) and len(root) == 3 and isinstance(root[0], str)
            and _int(root[1]) and _int(root[2]) for root in roots),
            f"roots {roots!r} are not [topic, partition, event time] triples")
        _expect(value is None or _int(value), f"watermark {value!r} is not an integer")
        _expect(held is None or _int(held), f"held-until {held!r} is not an integer")
        PartitionWatermark.decode(row, 0)
    elif kind == "open":
        _expect(isinstance(doc, list) and all(isinstance(k, str) for k in doc),
                f"{doc!r} is not a list of keys")
    else:
        raise ValueError(f"key {key!r} is neither a watermark nor an open-windows row")


def check_sequence_row(key: str, row: bytes) -> None:
    """Raise unless ``row`` is a producer-sequence table as ``producer_dedup`` writes it
    (checked before it is decoded, as window rows are)."""
    doc = json.loads(row)
    _expect(isinstance(doc, dict), f"{doc!r} is not an object")
    next_offset = doc["next"]
    _expect(_int(next_offset), f"next offset {next_offset!r} is not an integer")
    duplicates, producers = doc["dups"], doc["producers"]
    _expect(_int(duplicates), f"duplicates {duplicates!r} is not an integer")
    _expect(isinstance(producers, dict), f"producers {producers!r} is not an object")
    size = 3 if doc.get("seen") == "offset" else 2  # the timestamp rule kept [epoch, seq]
    for producer, entry in producers.items():
        _expect(isinstance(entry, list) and len(entry) >= size
                and all(map(_int, entry[:size])),
                f"producer {producer!r}: {entry!r} is not [epoch, sequence, offset]")
    PartitionSequences.decode(row)


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
