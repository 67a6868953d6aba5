"""The pipeline of test_single_worker_order_worker: events {"k", "ts"} seen (republished), counted
per key per minute, then counted per key. Topics from ``ONCEFLOW_SWO_INPUT`` and
``ONCEFLOW_SWO_SEEN``."""

from __future__ import annotations

import os
from typing import Any

from onceflow.stages import Pipeline, Tumbling


def count(n: int, _: Any) -> int:
    return n + 1


pipeline = (
    Pipeline(os.environ.get("ONCEFLOW_SWO_ID", "sw-order"),
             topics=(os.environ.get("ONCEFLOW_SWO_INPUT", "events"),), format="json")
    .republish("seen", os.environ.get("ONCEFLOW_SWO_SEEN", "seen"))  # processed: observable
    .aggregate("per_minute", key=lambda e: str(e["k"]), init=lambda: 0, fold=count,
               window=Tumbling(60_000, event_time_ms=lambda e: int(e["ts"])))
    .aggregate("counted", key=lambda e: str(e["k"]), init=lambda: 0, fold=count)
)
