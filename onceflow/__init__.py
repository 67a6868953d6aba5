"""onceflow: exactly-once streaming aggregations over Kafka.

User code needs only these names; the runtime's plumbing stays in its modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.stages import Envelope, Pipeline, SourceRef
from onceflow.stages.cleanup import cleanup
from onceflow.stages.declarations import ProducerDedup

if TYPE_CHECKING:
    from onceflow.runtime.settings import Settings

__all__ = ["Envelope", "Pipeline", "ProducerDedup", "SourceRef", "cleanup", "read_states", "run"]


def run(config_path: str | Path) -> int:
    """Run the worker described by a HOCON file until SIGTERM; returns the exit code."""
    from onceflow.runtime.cli import main  # the runtime loads only when asked to run

    return main(["run", "-c", str(config_path)])


def read_states(config: Settings | str | Path, stage: str, key: str | None = None, *,
                history: bool = False) -> list[dict[str, Any]]:
    """The persisted states of an aggregate stage, decoded, in plain Python (no Spark).

    See ``onceflow.runtime.states.read_states``: one dict per key (``stage``, ``key``,
    ``value``), per open window for a windowed stage (``window_start``, ``window_end``,
    ``closed``), and with ``history=True`` the closed windows too.
    """
    from onceflow.runtime.states import read_states as read

    return read(config, stage, key, history=history)
