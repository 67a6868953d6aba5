"""The pipelines the benchmarks run in real ``onceflow run`` workers, configured by env.

``republisher``: a stateless (non-exclusive) republisher. Input
``{"id": 7, "parts": 3}`` (plain JSON) becomes ``{"id": 7, "part": 0}`` ..
``{"id": 7, "part": 2}``, keyed by id, in ``BENCH_OUTPUT`` as envelopes or,
with ``BENCH_FORMAT=json``, plain JSON with the origin in headers.

``soak``: input ``{"k": "k0001234", "v": [3, 1]}`` (plain JSON, Kafka key = k)
is one event per element of ``v``, all for key ``k``, folded into a small
per-key state ``{"n": count, "sum": total}`` (the size of the robots' counts).

Both read ``BENCH_TOPIC``; the worker finds this module on its PYTHONPATH.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from onceflow.stages import Pipeline

_TOPIC = os.environ.get("BENCH_TOPIC", "bench-in")


def parts(item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for part in range(int(item["parts"])):
        yield {"id": item["id"], "part": part}


def soak_events(record: dict[str, Any]) -> list[tuple[str, int]]:
    key = record["k"]
    return [(key, value) for value in record["v"]]


def new_total() -> dict[str, int]:
    return {"n": 0, "sum": 0}


def add(state: dict[str, int], event: tuple[str, int]) -> dict[str, int]:
    """A new state (never mutate the old one)."""
    return {"n": state["n"] + 1, "sum": state["sum"] + event[1]}


republisher = (
    Pipeline("bench_republisher", topics=(_TOPIC,), format="json")
    .flat_map("parts", parts)
    .republish("out", os.environ.get("BENCH_OUTPUT", "bench-out"),
               key=lambda p: str(p["id"]), format=os.environ.get("BENCH_FORMAT", "envelope"),
               payload_type="application/json")
)

soak = (
    Pipeline("bench_soak", topics=(_TOPIC,), format="json")
    .flat_map("events", soak_events)
    .aggregate("per_key", key=itemgetter(0), init=new_total, fold=add)
)
