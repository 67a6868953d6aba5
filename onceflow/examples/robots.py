"""The robot screw-fastening pipeline: per-robot ok/failed counts, exactly once.

Robots write plain JSON, ``{"serial": "robot-0042", "seq": 17, "results":
[{"ok": true, "ts": ...}, ...]}``, keyed by serial; ``seq`` counts each
robot's reports, and a robot that missed an acknowledgement sends a report
again with the same ``seq``. The pipelines declare ``format="json"`` and
producer-sequence dedup on ``(serial, seq)``, so those copies are dropped
before any step. Each record reports 1-5 fastening results; the flat-map
splits them into single results that are folded as one unit. The input topic is
``robot-reports`` unless ``ONCEFLOW_ROBOTS_TOPIC`` names another (tests use
one topic per run); the counts live in Redis unless ``ONCEFLOW_ROBOTS_STORE``
names another store (``cassandra``).
"""

from __future__ import annotations

import os
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

from onceflow.stages import Pipeline
from onceflow.stages.producer_dedup import ProducerDedup

Counts = dict[str, int]


class Fastening(NamedTuple):
    """One screw-fastening result."""

    robot: str
    ok: bool
    ts: int


def report_dedup(store: str = "redis") -> ProducerDedup:
    """Each robot is a producer; its ``seq`` is the sequence (tables kept in ``store``)."""
    return ProducerDedup(producer=itemgetter("serial"), sequence=itemgetter("seq"), store=store)


def fastenings(report: dict[str, Any]) -> list[Fastening]:
    """One event per fastening result, each tagged with its robot."""
    robot = report["serial"]
    return [Fastening(robot, bool(r["ok"]), r["ts"]) for r in report["results"]]


def new_counts() -> Counts:
    return {"ok": 0, "failed": 0}


def count(state: Counts, fastening: Fastening) -> Counts:
    """A new state (never mutate the old one: a failed unit is rolled back)."""
    if fastening.ok:
        return {"ok": state["ok"] + 1, "failed": state["failed"]}
    return {"ok": state["ok"], "failed": state["failed"] + 1}


def outcome_of(fastening: Fastening) -> str:
    return "ok" if fastening.ok else "failed"


def tally(total: int, fastening: Fastening) -> int:
    return total + 1


def build_fleet(topic: str, store: str = "redis") -> Pipeline:
    """Fleet-wide ok/failed counts: each key is fed by every root partition.

    Exact with one worker (``onceflow.single-worker = true``); to scale it out,
    add ``.repartition("by_outcome", key=outcome_of)`` before the aggregate.
    """
    return (
        Pipeline("fleet", topics=(topic,), format="json", dedup=report_dedup(store))
        .flat_map("fastenings", fastenings)
        .aggregate("fleet", key=outcome_of, init=int, fold=tally, store=store)
    )


def build(topic: str, store: str = "redis") -> Pipeline:
    return (
        Pipeline("robots", topics=(topic,), format="json", dedup=report_dedup(store))
        .flat_map("fastenings", fastenings)
        .aggregate("per_robot", key=attrgetter("robot"), init=new_counts, fold=count,
                   store=store)
    )


pipeline = build(
    os.environ.get("ONCEFLOW_ROBOTS_TOPIC", "robot-reports"),
    store=os.environ.get("ONCEFLOW_ROBOTS_STORE", "redis"),
)
fleet = build_fleet(os.environ.get("ONCEFLOW_ROBOTS_TOPIC", "robot-reports"))
