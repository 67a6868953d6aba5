"""The pipeline of test_join_worker: payments joined with a merchants table, republished
enriched and totalled per category. Topics from ``ONCEFLOW_JOIN_PAYMENTS``,
``ONCEFLOW_JOIN_MERCHANTS`` and ``ONCEFLOW_JOIN_OUTPUT``."""

from __future__ import annotations

import os
from typing import Any

from onceflow.stages import Pipeline, Table


def enrich(payment: dict[str, Any], row: dict[str, Any] | None) -> dict[str, Any]:
    return {**payment, "cat": None if row is None else row["cat"]}


def add(total: int, payment: dict[str, Any]) -> int:
    return total + int(payment["amount"])


pipeline = (
    Pipeline(os.environ.get("ONCEFLOW_JOIN_ID", "join-it"),
             topics=(os.environ.get("ONCEFLOW_JOIN_PAYMENTS", "payments"),), format="json")
    .join("merchant", table=Table(os.environ.get("ONCEFLOW_JOIN_MERCHANTS", "merchants")),
          on=lambda p: str(p["merchant"]), merge=enrich)
    .republish("enriched", os.environ.get("ONCEFLOW_JOIN_OUTPUT", "enriched"),
               key=lambda p: str(p["merchant"]))
    .aggregate("totals", key=lambda p: str(p["cat"]), init=lambda: 0, fold=add)
)
