"""Device reports from at-least-once gateways: plain JSON with producer sequences.

A gateway writes ``{"device": "d-17", "n": 3}`` keyed by device, with the
headers ``producer`` (its id) and ``seq`` (its sequence number); after a
lost ack it sends a report again, same sequence, new offset. Every pipeline
here declares ``format="json"`` and dedup on those headers, so the copies
are dropped before any step.

``totals`` splits each report into ``n`` units of its device (one unit of
fan-out each, folded together) and sums them per device. ``normalize`` is a stateless
republisher of the reports to another topic (its dedup tables live in
Redis), and ``normalized_totals`` sums per device from that topic. Topics
come from ``ONCEFLOW_DEVICES_TOPIC`` and ``ONCEFLOW_DEVICES_NORMALIZED_TOPIC``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages import Pipeline
from onceflow.stages.producer_dedup import ProducerDedup

DEDUP = ProducerDedup(producer="producer", sequence="seq")


def units(report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``n`` units of 1 for the report's device (a key fed only from the device's partition:
    a fleet-wide key would be fed from every partition, see "Scaling out")."""
    for _ in range(int(report["n"])):
        yield {"device": str(report["device"]), "n": 1}


def add(total: int, unit: dict[str, Any]) -> int:
    return total + int(unit["n"])


def normal(report: dict[str, Any]) -> dict[str, Any]:
    return {"device": str(report["device"]), "n": int(report["n"])}


def encode(report: dict[str, Any]) -> bytes:
    return json.dumps(report, separators=(",", ":")).encode()


def decode_normal(envelope: Envelope) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(envelope.payload)
    return parsed


def build_totals(topic: str) -> Pipeline:
    return (
        Pipeline("devices", topics=(topic,), format="json", dedup=DEDUP)
        .flat_map("units", units)
        .aggregate("totals", key=lambda unit: str(unit["device"]), init=int, fold=add)
    )


def build_normalize(topic: str, normalized: str) -> Pipeline:
    return (
        Pipeline("devices-normalize", topics=(topic,), format="json",
                 dedup=ProducerDedup(producer="producer", sequence="seq", store="redis"))
        .map("normal", normal)
        .republish("normalized", normalized, encode=encode, key=lambda r: str(r["device"]),
                   payload_type="application/json")
    )


def build_normalized_totals(normalized: str) -> Pipeline:
    return (
        Pipeline("devices-normalized", topics=(normalized,), decode=decode_normal)
        .aggregate("per_device", key=lambda r: str(r["device"]), init=int, fold=add)
    )


_TOPIC = os.environ.get("ONCEFLOW_DEVICES_TOPIC", "device-reports")
_NORMALIZED = os.environ.get("ONCEFLOW_DEVICES_NORMALIZED_TOPIC", "device-reports-normal")
totals = build_totals(_TOPIC)
normalize = build_normalize(_TOPIC, _NORMALIZED)
normalized_totals = build_normalized_totals(_NORMALIZED)
