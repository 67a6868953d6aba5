"""``--job module:function``: a user's Spark function over the pipeline's DataFrames.

A job is a plain function::

    def job(spark: SparkSession, frames: dict[str, DataFrame], out: Path,
            settings: Settings) -> object

``frames`` maps each aggregate's id to its DataFrame (pipeline order; see
:mod:`onceflow.analytics.frames` for the columns), already restricted by
``--since``/``--until``; ``out`` is the output directory (created); ``settings``
the loaded configuration (e.g. ``settings.analytics.top_n``). What it returns
goes back to the caller of ``run_analytics`` (the CLI ignores it). The generic
report (:func:`onceflow.analytics.overview.overview`) is such a function too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from onceflow.runtime.app_path import import_hint
from onceflow.runtime.settings import Settings

__all__ = ["Job", "load_job"]

Job = Callable[[Any, Mapping[str, Any], Path, Settings], Any]


def load_job(spec: str) -> Job:
    """Import ``module:function``; ValueError saying what is wrong otherwise."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"--job expects module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"--job {spec}: cannot import {module_name!r}: {error}"
                         f"{import_hint(module_name, error)}") from error
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"--job {spec}: module {module_name!r} has no function {name!r}")
    job: Job = function
    return job
