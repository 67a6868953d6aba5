"""Re-keying exactly once: orders regrouped by product, then cleaned into a pristine topic.

Orders (plain JSON, keyed by customer) ``{"order": "o-7", "customer": "c-3",
"lines": [{"sku": "s-12", "qty": 2}, ...]}`` become one record per line,
``{"order": "o-7", "line": 0, "sku": "s-12", "qty": 2}``, keyed by ``sku``:

- ``regroup`` is a stateless republisher (partition by key). Each output
  partition has many writers, so after a crash it re-sends part of its
  output and the regrouped topic holds some lines twice.
- ``cleanup`` (``onceflow.cleanup``) copies the regrouped topic into the
  pristine one, each line once, per sku in the order of the orders
  partition, as plain JSON any Kafka consumer reads.

- ``reshuffle`` (optional) re-keys the orders by order id first, into a
  topic that ``regroup`` then reads instead of the orders: a re-keying of a
  topic that was itself re-keyed (and holds re-sent copies), which the
  cleanup handles the same way (watermarks per route, ``stages.lineage``).

Topics come from ``ONCEFLOW_REGROUP_ORDERS``, ``ONCEFLOW_REGROUP_REGROUPED``
and ``ONCEFLOW_REGROUP_PRISTINE`` (and ``ONCEFLOW_REGROUP_RESHUFFLED``: when
set, ``regroup`` reads it), the store from ``ONCEFLOW_REGROUP_STORE``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from onceflow.stages import Pipeline
from onceflow.stages.cleanup import cleanup as cleanup_of


def lines(order: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for index, entry in enumerate(order["lines"]):
        yield {"order": order["order"], "line": index, "sku": entry["sku"], "qty": entry["qty"]}


def sku(line: dict[str, Any]) -> str:
    return str(line["sku"])


def order_id(order: dict[str, Any]) -> str:
    return str(order["order"])


def build_reshuffle(orders: str, reshuffled: str) -> Pipeline:
    return (
        Pipeline("orders-reshuffle", topics=(orders,), format="json")
        .republish("by_order", reshuffled, key=order_id, format="json")
    )


def build_regroup(orders: str, regrouped: str) -> Pipeline:
    return (
        Pipeline("orders-regroup", topics=(orders,), format="json")
        .flat_map("lines", lines)
        .republish("by_sku", regrouped, key=sku, format="json")
    )


def build_cleanup(regrouped: str, pristine: str, store: str = "redis") -> Pipeline:
    return cleanup_of("orders-regroup-cleanup", regrouped, pristine, store=store)


_ORDERS = os.environ.get("ONCEFLOW_REGROUP_ORDERS", "orders")
_REGROUPED = os.environ.get("ONCEFLOW_REGROUP_REGROUPED", "order-lines-by-sku")
_PRISTINE = os.environ.get("ONCEFLOW_REGROUP_PRISTINE", "order-lines-by-sku-pristine")
_RESHUFFLED = os.environ.get("ONCEFLOW_REGROUP_RESHUFFLED", "")
_STORE = os.environ.get("ONCEFLOW_REGROUP_STORE", "redis")
reshuffle = build_reshuffle(_ORDERS, _RESHUFFLED or "orders-by-id")
regroup = build_regroup(_RESHUFFLED or _ORDERS, _REGROUPED)
cleanup = build_cleanup(_REGROUPED, _PRISTINE, _STORE)
