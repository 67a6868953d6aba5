"""What a pipeline persisted, read in plain Python: ``read_states`` and ``onceflow states``.

For a look at a stage without Spark and without knowing the store layout: the
stage's store client (the worker's own, ``wiring.open_store``) scans its rows
and the states are decoded the way the worker decodes them. A windowed
aggregate's state holds its *open* windows; the windows it closed are final
history rows beside it (``history=True`` reads those too). Where a crash
between a window's history row and its state left both, they are equal and
the history row is kept, as the Spark readers do.

A scan reads the whole stage (Cassandra pages through its whole ``states``
table): for inspecting and scripts, not for analytics at scale, which
``onceflow analytics`` reads in Spark's executors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onceflow.runtime.config import ConfigError, Settings, load_settings
from onceflow.stages.pipeline import Aggregate, Pipeline
from onceflow.stages.state import decode_state
from onceflow.stores.base import HistoryRows, StateRows

__all__ = ["cli", "iter_states", "read_states"]


def read_states(config: Settings | str | Path, stage: str, key: str | None = None, *,
                history: bool = False, pipeline: Pipeline | None = None) -> list[dict[str, Any]]:
    """The persisted states of an aggregate stage, decoded, sorted by key (and window).

    Args:
        config: the loaded settings, or the path of the application HOCON file.
        stage: an aggregate's id in the configured pipeline (or ``pipeline``).
        key: only this key's rows.
        history: windowed stages: also the closed windows (history rows).
        pipeline: the pipeline, instead of loading the configured one.

    Returns:
        One dict per key (``stage``, ``key``, ``value``); for a windowed stage one per
        window, with ``window_start``, ``window_end`` (epoch ms) and ``closed``.

    Raises:
        ConfigError: a bad configuration, or no such aggregate.
    """
    rows = list(iter_states(config, stage, key, history=history, pipeline=pipeline))
    return sorted(rows, key=lambda row: (row["key"], row.get("window_start") or 0))


def iter_states(config: Settings | str | Path, stage: str, key: str | None = None, *,
                history: bool = False, pipeline: Pipeline | None = None
                ) -> Iterator[dict[str, Any]]:
    """``read_states``' rows in the store's scan order, without holding them all."""
    from onceflow.runtime.wiring import load_pipeline, open_store

    settings = config if isinstance(config, Settings) else load_settings(config, {})
    if pipeline is None:
        pipeline = load_pipeline(settings)
    spec = _aggregate(settings, pipeline, stage)
    store = open_store(settings, spec.store, pipeline.id)
    try:
        yield from _rows(store, store if history else None, spec, key)
    finally:
        store.close()


def _aggregate(settings: Settings, pipeline: Pipeline, stage: str) -> Aggregate:
    for spec in pipeline.aggregates:
        if spec.id == stage:
            return spec
    names = ", ".join(spec.id for spec in pipeline.aggregates) or "none"
    raise ConfigError(settings.source, "onceflow.pipeline",
                      f"pipeline {pipeline.id!r} has no aggregate {stage!r} (it has {names})")


def _rows(store: StateRows, history: HistoryRows | None, spec: Aggregate, key: str | None
          ) -> Iterator[dict[str, Any]]:
    """A stage's rows from ``store``, and its closed windows from ``history`` if given."""
    states = (store.load(spec.id, [key]).items() if key is not None
              else store.scan(spec.id))
    if spec.window is None:
        for name, data in states:
            yield {"stage": spec.id, "key": name, "value": decode_state(data).value}
        return
    size = spec.window.size_ms
    closed: set[tuple[str, int]] = set()
    if history is not None:
        for name, start, data in history.scan_history(spec.id):
            if key is None or name == key:
                closed.add((name, start))
                yield _window(spec.id, name, start, size, True, json.loads(data))
    for name, data in states:
        state = decode_state(data).value
        for start, value in state["open"].items():
            if (name, int(start)) not in closed:
                yield _window(spec.id, name, int(start), size, False, value)


def _window(stage: str, key: str, start: int, size: int, closed: bool, value: Any
            ) -> dict[str, Any]:
    return {"stage": stage, "key": key, "window_start": start, "window_end": start + size,
            "closed": closed, "value": value}


def cli(argv: list[str]) -> int:
    """``onceflow states -c app.conf STAGE [KEY] [--history]``: one JSON line per row."""
    parser = argparse.ArgumentParser(
        prog="onceflow states",
        description="Print the persisted states of an aggregate stage as JSON lines "
                    "(windowed stages: one line per open window; --history adds the closed "
                    "ones). Rows come in the store's scan order.")
    parser.add_argument("-c", "--config", required=True, help="application HOCON file")
    parser.add_argument("stage", help="an aggregate's id")
    parser.add_argument("key", nargs="?", help="only this key")
    parser.add_argument("--history", action="store_true",
                        help="windowed stages: also the closed windows (history rows)")
    args = parser.parse_args(argv)
    try:
        for row in iter_states(args.config, args.stage, args.key, history=args.history):
            sys.stdout.write(json.dumps(row, separators=(",", ":")) + "\n")
    except ConfigError as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return 2
    return 0
