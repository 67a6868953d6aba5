"""The pipelines of ``join_cost.py``: a per-key sum, with and without a join before it.

Input ``{"key": "k0042", "value": 7}`` (plain JSON, Kafka key = key) on ``BENCH_TOPIC``;
the table ``{"w": 3}`` per key on ``BENCH_TABLE`` (Kafka key = key): ``join_sum`` adds
``value * w`` per key, ``plain_sum`` adds ``value``. The worker finds this module on
its PYTHONPATH.
"""

from __future__ import annotations

import os
from operator import itemgetter
from typing import Any

from onceflow.stages import Pipeline, Table

_TOPIC = os.environ.get("BENCH_TOPIC", "bench")
_TABLE = os.environ.get("BENCH_TABLE", "bench-table")


def weighted(value: dict[str, Any], row: dict[str, Any] | None) -> int:
    return int(value["value"]) * (1 if row is None else int(row["w"]))


def add(total: int, value: Any) -> int:
    return total + (value if isinstance(value, int) else int(value["value"]))


def key_of(value: dict[str, Any]) -> str:
    return str(value["key"])


plain_sum = (
    Pipeline("bench_plain_sum", topics=(_TOPIC,), format="json")
    .aggregate("sum", key=itemgetter("key"), init=int, fold=add)
)

join_sum = (
    Pipeline("bench_join_sum", topics=(_TOPIC,), format="json")
    .join("weight", table=Table(_TABLE), on=key_of,
          merge=lambda v, row: {"key": v["key"], "value": weighted(v, row)})
    .aggregate("sum", key=itemgetter("key"), init=int, fold=add)
)
