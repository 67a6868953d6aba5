"""The pipelines the benchmarks run in real ``onceflow run`` workers, configured by env.

``republisher``: a stateless (non-exclusive) republisher. Input
``{"id": 7, "parts": 3}`` (plain JSON) becomes ``{"id": 7, "part": 0}`` ..
``{"id": 7, "part": 2}``, keyed by id, in ``BENCH_OUTPUT`` as envelopes or,
with ``BENCH_FORMAT=json``, plain JSON with the origin in headers.

``soak``: input ``{"k": "k0001234", "v": [3, 1]}`` (plain JSON, Kafka key = k)
is one event per element of ``v``, all for key ``k``, folded into a small
per-key state ``{"n": count, "sum": total}`` (the size of the robots' counts).

``robots_envelope``: the robots' aggregate path (``onceflow.examples.robots``) over the
same reports copied into onceflow envelopes (JSON payload, a one-hop source chain, as a
republisher writes them; ``throughput.py --format envelope``): the default decoder hands
the payload to a map step that parses it as ``format="json"`` does (``json_value``); the
chain's root dedups, so no producer-sequence dedup.

``per_key_sum``: the peers' workload (``peers.py``): input ``{"key": "k0042", "value": 7}``
(plain JSON, Kafka key = key), one sum per key, nothing else.

All read ``BENCH_TOPIC``; the worker finds this module on its PYTHONPATH.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from operator import attrgetter, itemgetter
from typing import Any

from onceflow.examples.robots import count, fastenings, new_counts
from onceflow.stages import Pipeline
from onceflow.stages.formats import json_value

_TOPIC = os.environ.get("BENCH_TOPIC", "bench-in")


def parts(item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for part in range(int(item["parts"])):
        yield {"id": item["id"], "part": part}


def soak_events(record: dict[str, Any]) -> list[tuple[str, int]]:
    key = record["k"]
    return [(key, value) for value in record["v"]]


def new_total() -> dict[str, int]:
    return {"n": 0, "sum": 0}


def add_value(total: int, record: dict[str, Any]) -> int:
    return total + record["value"]


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

robots_envelope = (
    Pipeline("bench_robots_envelope", topics=(_TOPIC,), format="envelope")
    .map("report", json_value)
    .flat_map("fastenings", fastenings)
    .aggregate("per_robot", key=attrgetter("robot"), init=new_counts, fold=count)
)

per_key_sum = (
    Pipeline("bench_per_key_sum", topics=(_TOPIC,), format="json")
    .aggregate("sum", key=itemgetter("key"), init=int, fold=add_value)
)
