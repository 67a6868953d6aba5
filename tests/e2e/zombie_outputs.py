"""The pipeline of the zombie outputs test: every kind of exclusive output at once.

Each JSON item ``{"id", "k", "t"}`` is copied once to an exclusive republish
topic (``pristine``, the partition of its input's number), counted per key
(``total``, no window: the totals the test checks), then counted per key and
minute of ``t`` (``per_minute``, no allowed lateness): an item whose minute has
closed for its key is a late event. Topics come from the environment
(``ONCEFLOW_ZOMBIE_TOPIC``, ``ONCEFLOW_ZOMBIE_PRISTINE``).
"""

from __future__ import annotations

import os
from typing import Any

from onceflow.stages import Pipeline, Tumbling

MINUTE_MS = 60_000


def key_of(item: dict[str, Any]) -> str:
    return str(item["k"])


def zero() -> int:
    return 0


def plus_one(total: int, item: dict[str, Any]) -> int:
    return total + 1


def build(topic: str, pristine: str) -> Pipeline:
    return (
        Pipeline("zombie-outputs", topics=(topic,), format="json")
        .republish("pristine", pristine, exclusive=True, format="json",
                   key=lambda item: str(item["id"]))
        .aggregate("total", key=key_of, init=zero, fold=plus_one, store="redis")
        .aggregate("per_minute", key=key_of, init=zero, fold=plus_one, store="redis",
                   window=Tumbling(MINUTE_MS, event_time_ms=lambda item: int(item["t"])))
    )


pipeline = build(os.environ.get("ONCEFLOW_ZOMBIE_TOPIC", "zombie-in"),
                 os.environ.get("ONCEFLOW_ZOMBIE_PRISTINE", "zombie-pristine"))
