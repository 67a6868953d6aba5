"""The pipeline of test_join_under_sigkill: payments joined with a changing merchants
table, each enriched payment republished (what its first processing met), then totalled
per category through a repartition. Topics from ``ONCEFLOW_JOIN_*``."""

from __future__ import annotations

import os
from typing import Any

from onceflow.stages import Pipeline, Table


def enrich(payment: dict[str, Any], row: dict[str, Any] | None) -> dict[str, Any]:
    return {**payment, "cat": None if row is None else row["cat"]}


def add(total: dict[str, int], payment: dict[str, Any]) -> dict[str, int]:
    return {"n": total["n"] + 1, "amount": total["amount"] + int(payment["amount"])}


def zero() -> dict[str, int]:
    return {"n": 0, "amount": 0}


pipeline = (
    Pipeline(os.environ.get("ONCEFLOW_JOIN_ID", "payments"),
             topics=(os.environ.get("ONCEFLOW_JOIN_PAYMENTS", "payments"),), format="json")
    .join("merchant", table=Table(os.environ.get("ONCEFLOW_JOIN_MERCHANTS", "merchants")),
          on=lambda p: str(p["merchant"]), merge=enrich)
    .republish("enriched", os.environ.get("ONCEFLOW_JOIN_OUTPUT", "enriched"),
               key=lambda p: str(p["id"]))
    .repartition("by-category", key=lambda p: str(p["cat"]),
                 topic=os.environ.get("ONCEFLOW_JOIN_HOP", "payments-by-category"))
    .aggregate("totals", key=lambda p: str(p["cat"]), init=zero, fold=add)
)
