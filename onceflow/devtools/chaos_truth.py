"""The chaos run's ground truth and what the stores and the late-events topic hold.

Kept apart from ``onceflow.devtools.chaos`` (the run itself) and written
independently of ``onceflow.stages.windows``: the tests compare the two.
"""

from __future__ import annotations

import json
from collections import Counter

from onceflow.devtools.harness import read_all
from onceflow.devtools.robot_stream import RobotStream, parse_report
from onceflow.examples.robot_chain import (
    DAY_MS,
    DAY_STAGE,
    LATENESS_MS,
    MINUTE_MS,
    MINUTE_STAGE,
)
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.state import decode_state
from onceflow.stages.units import item_at
from onceflow.stores.base import StateStore

__all__ = ["STAGES", "LateEvents", "Windows", "expected_windows", "read_hop", "read_late",
           "stored_windows"]

Windows = dict[tuple[str, int], Counter[str]]  # (robot, window start) -> ok/failed
STAGES = {MINUTE_STAGE: (MINUTE_MS, LATENESS_MS), DAY_STAGE: (DAY_MS, 0)}


#: Per stage, the late events found: (robot, event time, outcome) -> how many.
LateEvents = dict[str, Counter[tuple[str, int, str]]]


def expected_windows(stream: RobotStream, late: LateEvents | None = None
                     ) -> tuple[dict[str, Windows], dict[str, int]]:
    """Every window of both stages from the input, less the events found ``late``; and
    per stage how many of those matched an event of the input.

    Written independently of ``onceflow.stages.windows`` on purpose: every event
    of the input is in its window unless it is among the late events of that
    stage, and then it goes no further (the daily stage never sees it). A
    re-sent report (a ``(serial, seq)`` seen before) goes nowhere. Whether an
    event is late depends on how the partitions interleaved, so it is read from
    the late-events topic (``read_late``), not recomputed.
    """
    windows: dict[str, Windows] = {stage: {} for stage in STAGES}
    found: Counter[str] = Counter()
    left = {stage: Counter(events) for stage, events in (late or {}).items()}
    reports: set[tuple[str, int]] = set()
    for _, value in stream.messages:
        report = parse_report(value)
        robot = report["serial"]
        if (robot, report["seq"]) in reports:
            continue
        reports.add((robot, report["seq"]))
        for result in report["results"]:
            outcome, ts = ("ok" if result["ok"] else "failed"), result["ts"]
            for stage, (size, _) in STAGES.items():
                events = left.get(stage)
                if events and events[(robot, ts, outcome)] > 0:
                    events[(robot, ts, outcome)] -= 1
                    found[stage] += 1
                    break  # a late event reaches no later stage
                windows[stage].setdefault((robot, ts - ts % size), Counter())[outcome] += 1
    return windows, dict(found)


async def read_late(bootstrap: str, topic: str, partitions: int
                    ) -> tuple[LateEvents, int]:
    """The late events of the windows pipeline, per stage, and how many were written
    twice (same stage, root partition and position)."""
    late: LateEvents = {}
    seen: set[tuple[bytes, ...]] = set()
    twice = 0
    for record in await read_all(bootstrap, topic, partitions):
        headers = dict(record.headers)
        slot = tuple(headers[f"onceflow.{name}"] for name in ("stage", "root", "position"))
        if slot in seen:
            twice += 1
            continue
        seen.add(slot)
        position = tuple(int(n) for n in headers["onceflow.position"].split(b"."))
        robot, ok, ts = json.loads(  # the late item of a unit, or the record itself
            item_at(Envelope.FromString(record.value or b""), position).payload)
        stage = headers["onceflow.stage"].decode()
        late.setdefault(stage, Counter())[(robot, ts, "ok" if ok else "failed")] += 1
    return late, twice


async def read_hop(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """The distinct records of a republished topic (one per source chain: a replay's
    re-writes count once) and the events they hold (a unit's items, else one each).

    How many records a run's kills made the republisher write again depends on when
    they struck; these two do not.
    """
    chains: set[tuple[tuple[str, int, int, int], ...]] = set()
    events = 0
    for record in await read_all(bootstrap, topic, partitions):
        envelope = Envelope.FromString(record.value or b"")
        chain = tuple((s.topic, s.partition, s.offset, s.index) for s in envelope.source_chain)
        if chain not in chains:
            chains.add(chain)
            events += len(envelope.items) or 1
    return len(chains), events


def stored_windows(store: StateStore, stage: str) -> tuple[Windows, int]:
    """Closed windows from history plus open ones from current states; and overlaps."""
    found: Windows = {}
    overlaps = 0
    for robot, start, value in store.scan_history(stage):
        found[(robot, start)] = Counter(json.loads(value))
    for robot, encoded in store.scan(stage):
        for start, counts in decode_state(encoded).value["open"].items():
            overlaps += (robot, int(start)) in found
            found[(robot, int(start))] = Counter(counts)
    return found, overlaps
