"""The pipeline of test_deploy_metrics: an exclusive republish and an aggregate, so a
worker running it exports every series the shipped dashboard and alerts query.

Topics come from ``ONCEFLOW_MIRROR_TOPIC`` and ``ONCEFLOW_MIRROR_OUTPUT``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from onceflow.stages import Pipeline


def parts(item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for part in range(int(item["parts"])):
        yield {"id": item["id"], "part": part}


def count(total: int, _: Any) -> int:
    return total + 1


pipeline = (
    Pipeline("deploy-metrics", topics=(os.environ.get("ONCEFLOW_MIRROR_TOPIC", "in"),),
             format="json")
    .flat_map("parts", parts)
    .republish("out", os.environ.get("ONCEFLOW_MIRROR_OUTPUT", "out"),
               key=lambda p: str(p["id"]), exclusive=True, payload_type="application/json")
    .aggregate("per_item", key=lambda p: str(p["id"]), init=lambda: 0, fold=count)
)
