"""A synthetic robot screw-fastening stream with its ground truth.

Deterministic for a seed: each message is one robot's report of 1-5
fastening results (ok or failed, with a timestamp), wrapped in an Envelope
and keyed by robot, so one robot's reports stay in one partition.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

from onceflow.protos.envelope_pb2 import Envelope

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass
class RobotStream:
    messages: list[tuple[bytes, bytes]]  # (key, envelope bytes)
    truth: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def events(self) -> int:
        return sum(sum(c.values()) for c in self.truth.values())


def generate(messages: int, robots: int = 1000, seed: int = 7, failure_rate: float = 0.08,
             disorder: float = 0.0, max_delay_ms: int = 120_000) -> RobotStream:
    """``disorder``: the share of results whose timestamp is up to ``max_delay_ms`` old
    (out of order, some of them too late for their window)."""
    rng = random.Random(seed)
    stream = RobotStream([])
    for i in range(messages):
        robot = f"robot-{rng.randrange(robots):04d}"
        ts = START_MS + i * 50
        results = [
            {"ok": rng.random() >= failure_rate,
             "ts": ts + j - (rng.randrange(max_delay_ms) if rng.random() < disorder else 0)}
            for j in range(rng.randint(1, 5))
        ]
        counts = stream.truth.setdefault(robot, Counter())
        for r in results:
            counts["ok" if r["ok"] else "failed"] += 1
        envelope = Envelope(
            event_id=f"report-{seed}-{i}",
            event_time_ms=ts,
            key=robot,
            payload=json.dumps({"robot": robot, "results": results}).encode(),
            payload_type="application/json",
        )
        stream.messages.append((robot.encode(), envelope.SerializeToString()))
    return stream


def fastening_events(stream: RobotStream) -> list[tuple[bytes, bytes]]:
    """The events the robot republisher would emit, one per result (no source chain)."""
    out = []
    for key, value in stream.messages:
        report = json.loads(Envelope.FromString(value).payload)
        for r in report["results"]:
            payload = json.dumps([report["robot"], r["ok"], r["ts"]]).encode()
            out.append((key, Envelope(key=report["robot"], payload=payload).SerializeToString()))
    return out
