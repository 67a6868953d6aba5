"""onceflow: exactly-once streaming aggregations over Kafka.

User code needs only these names; the runtime's plumbing stays in its modules.
"""

from pathlib import Path

from onceflow.stages import Envelope, Pipeline, SourceRef
from onceflow.stages.cleanup import cleanup
from onceflow.stages.producer_dedup import ProducerDedup

__all__ = ["Envelope", "Pipeline", "ProducerDedup", "SourceRef", "cleanup", "run"]


def run(config_path: str | Path) -> int:
    """Run the worker described by a HOCON file until SIGTERM; returns the exit code."""
    from onceflow.runtime.cli import main  # the runtime loads only when asked to run

    return main(["run", "-c", str(config_path)])
