"""Orders keyed by order id, totalled per customer: the case a repartition step is for.

The source topic is keyed by order id (its producer's choice), so one
customer's orders are spread over every partition. ``pipeline`` re-keys them
by customer through a repartition topic before the per-customer aggregate,
and scales out over any number of workers. ``unaligned`` aggregates straight
from the source: with more than one worker, orders of a customer whose state
is fed from another partition are dead-lettered with the reason (the
key-home check), never silently merged.

``build`` and ``build_unaligned`` are factories: a deployment names one in
``onceflow.pipeline`` and gives its arguments in the HOCON file::

    onceflow.pipeline = "onceflow.examples.orders:build"
    onceflow.pipeline-settings { topic = "orders", repartition-topic = "orders-by-customer" }

``pipeline`` is ``build`` with the defaults (topic ``orders``).
"""

from __future__ import annotations

import json
from typing import Any

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages import Pipeline

Order = dict[str, Any]  # {"id": str, "customer": str, "amount": int}
Totals = dict[str, int]  # {"orders": n, "amount": sum}


def decode_order(envelope: Envelope) -> Order:
    order: Order = json.loads(envelope.payload)
    return order


def customer_of(order: Order) -> str:
    return str(order["customer"])


def no_orders() -> Totals:
    return {"orders": 0, "amount": 0}


def add(totals: Totals, order: Order) -> Totals:
    """A new state (never mutate the old one: a failed unit is rolled back)."""
    return {"orders": totals["orders"] + 1, "amount": totals["amount"] + int(order["amount"])}


def build(topic: str = "orders", repartition_topic: str | None = None, store: str = "redis"
          ) -> Pipeline:
    """Per-customer totals, re-keyed by customer first: exact with any number of workers."""
    return (
        Pipeline("orders", topics=(topic,), decode=decode_order)
        .repartition("by_customer", key=customer_of, topic=repartition_topic)
        .aggregate("per_customer", key=customer_of, init=no_orders, fold=add, store=store)
    )


def build_unaligned(topic: str = "orders", store: str = "redis") -> Pipeline:
    """The same totals without the repartition: exact only with ``single-worker``."""
    return (
        Pipeline("orders-unaligned", topics=(topic,), decode=decode_order)
        .aggregate("per_customer", key=customer_of, init=no_orders, fold=add, store=store)
    )


pipeline = build()
