"""The user API: declare a pipeline as frozen stage specs with mandatory ids.

This package never imports actor or Kafka client code (a ruff rule holds
that line); the runtime interprets what is declared here. The user's modules
are ``pipeline``, ``steps``, ``republish_step``, ``join_step``, ``declarations``, ``formats`` (its
``__all__``), ``record_meta`` and ``cleanup``; the others are the engine (the
record path, fold kernels, wire, segments), private to onceflow, and the user's
modules import none of them (``tests/unit/test_layout.py``).
"""

from onceflow.compiled import check

check()  # before any compiled module loads: refuse one older than its source

from onceflow.protos.envelope_pb2 import Envelope, SourceRef  # noqa: E402
from onceflow.stages.declarations import Tumbling  # noqa: E402
from onceflow.stages.pipeline import (  # noqa: E402
    Aggregate,
    Filter,
    FlatMap,
    Join,
    Map,
    Pipeline,
    Repartition,
    Republish,
    Step,
    Table,
)

__all__ = [
    "Aggregate",
    "Envelope",
    "Filter",
    "FlatMap",
    "Join",
    "Map",
    "Pipeline",
    "Repartition",
    "Republish",
    "SourceRef",
    "Step",
    "Table",
    "Tumbling",
]
