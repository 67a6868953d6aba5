"""An exclusive republisher: each JSON item fans out to its parts, one writer per partition.

Input ``{"id": 7, "parts": 3}`` (plain JSON) becomes the outputs
``{"id": 7, "part": 0}`` .. ``{"id": 7, "part": 2}`` in the output
partition of the same number as the input's, written by that partition's
owner only, so a restarted worker skips what its predecessor already wrote
and the output topic holds each part once, in order. ``mirror`` writes
envelopes, ``mirror_plain`` plain JSON values with the origin in headers.
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


def build(topic: str, output: str, format: str = "envelope") -> Pipeline:
    return (
        Pipeline("mirror", topics=(topic,), format="json")
        .flat_map("parts", parts)
        .republish("out", output, key=lambda p: str(p["id"]), exclusive=True, format=format,
                   payload_type="application/json")
    )


_TOPIC = os.environ.get("ONCEFLOW_MIRROR_TOPIC", "mirror-in")
_OUTPUT = os.environ.get("ONCEFLOW_MIRROR_OUTPUT", "mirror-out")
mirror = build(_TOPIC, _OUTPUT)
mirror_plain = build(_TOPIC, _OUTPUT, "json")
