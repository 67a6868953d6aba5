"""A synthetic robot screw-fastening stream with its ground truth.

Deterministic for a seed. Each message is one robot's report of 1-5
fastening results (ok or failed, with a timestamp) as plain JSON, the way a
robot writes it: ``{"serial": "robot-0042", "seq": 17, "results": [...]}``,
keyed by serial so one robot's reports stay in one partition. ``seq``
counts each robot's reports from 0. With ``resend`` a share of the reports
is written a second time a few messages later (same bytes, a new offset), as
a robot does after a lost acknowledgement; the truth counts each report once.
"""

from __future__ import annotations

import heapq
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
RESEND_WITHIN = 10  # a re-send follows its original within this many messages


@dataclass
class RobotStream:
    messages: list[tuple[bytes, bytes]]  # (serial, JSON report), re-sends included
    truth: dict[str, Counter[str]] = field(default_factory=dict)
    resends: int = 0  # messages that repeat an earlier one
    next_seq: Counter[str] = field(default_factory=Counter)  # each robot's next ``seq``

    @property
    def events(self) -> int:
        return sum(sum(c.values()) for c in self.truth.values())

    @property
    def reports(self) -> int:
        """Distinct reports (messages without the re-sends)."""
        return len(self.messages) - self.resends


def encode_report(serial: str, seq: int, results: list[dict[str, Any]]) -> bytes:
    return json.dumps({"serial": serial, "seq": seq, "results": results},
                      separators=(",", ":")).encode()


def parse_report(value: bytes) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(value)
    return report


def report_id(value: bytes) -> bytes:
    """Bytes unique to one report (its serial and seq), to match it in a raw record."""
    return value[: value.index(b',"results"')]


def generate(messages: int, robots: int = 1000, seed: int = 7, failure_rate: float = 0.08,
             disorder: float = 0.0, max_delay_ms: int = 120_000,
             resend: float = 0.0, fleet: str = "robot",
             after: RobotStream | None = None, start_ms: int = 0) -> RobotStream:
    """``messages`` distinct reports, plus about ``resend`` x as many re-sends.

    ``disorder``: the share of results whose timestamp is up to ``max_delay_ms``
    old (out of order, some of them too late for their window). Re-sends draw
    from their own random stream, so the reports are the same whatever ``resend``.
    Serials are ``{fleet}-0000``...: streams written side by side by separate
    producers need fleets of their own (a serial is one robot, one sequence).
    A stream written ``after`` another by the same robots goes on with their
    sequences (a robot never reuses a ``seq``: it would be a duplicate).
    ``start_ms``: event times start that long after ``START_MS``.
    """
    rng = random.Random(seed)
    resend_rng = random.Random(seed + 1)
    stream = RobotStream([])
    seqs = stream.next_seq
    if after is not None:
        seqs.update(after.next_seq)
    pending: list[tuple[int, int, tuple[bytes, bytes]]] = []  # (due, tie-break, message)
    for i in range(messages):
        robot = f"{fleet}-{rng.randrange(robots):04d}"
        ts = START_MS + start_ms + i * 50
        results = [
            {"ok": rng.random() >= failure_rate,
             "ts": ts + j - (rng.randrange(max_delay_ms) if rng.random() < disorder else 0)}
            for j in range(rng.randint(1, 5))
        ]
        counts = stream.truth.setdefault(robot, Counter())
        for r in results:
            counts["ok" if r["ok"] else "failed"] += 1
        message = (robot.encode(), encode_report(robot, seqs[robot], results))
        seqs[robot] += 1
        stream.messages.append(message)
        while pending and pending[0][0] <= i:
            stream.messages.append(heapq.heappop(pending)[2])
        if resend and resend_rng.random() < resend:
            due = i + resend_rng.randint(1, RESEND_WITHIN)
            heapq.heappush(pending, (due, i, message))
            stream.resends += 1
    stream.messages.extend(message for _, _, message in sorted(pending))
    return stream


def fastening_events(stream: RobotStream) -> list[tuple[bytes, bytes]]:
    """The events the robot republisher would emit, one per result (no source chain).

    Re-sends are skipped: the republisher drops them as producer duplicates.
    """
    from onceflow.protos.envelope_pb2 import Envelope

    out = []
    seen: set[tuple[str, int]] = set()
    for key, value in stream.messages:
        report = parse_report(value)
        if (report["serial"], report["seq"]) in seen:
            continue
        seen.add((report["serial"], report["seq"]))
        for r in report["results"]:
            payload = json.dumps([report["serial"], r["ok"], r["ts"]]).encode()
            out.append((key, Envelope(key=report["serial"], payload=payload).SerializeToString()))
    return out
