"""A valid robot stream with hostile records mixed in, each with the reason it must get.

Valid reports follow ``onceflow.examples.robots``: robot ``r-<n>`` always to
partition ``n % partitions`` (its key's home), ``seq`` rising per robot.
Hostile records go to random partitions with odd keys and headers (header
names that are not UTF-8 need ``helpers.raw_header_names`` around the
producer); each kind
names a fragment of the ``onceflow.reason`` its dead letter must carry. None
can fold: the ones shaped like reports use serials no valid robot has.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from helpers import RawName

Headers = list[tuple[str, bytes]]
BIG = 2_000_000  # larger than a fetch (max_partition_fetch_bytes, 1 MiB by default)


@dataclass(frozen=True)
class Message:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    reason: str | None = None  # the dead letter's reason contains it; None: a valid report


def _report(serial: Any, seq: Any, rng: random.Random) -> dict[str, Any]:
    return {"serial": serial, "seq": seq,
            "results": [{"ok": rng.random() < 0.9, "ts": 0} for _ in range(rng.randint(1, 5))]}


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


#: kind -> (the record's value, key and headers from (index, rng, its partition), the reason)
Kind = tuple[Callable[[int, random.Random, int], tuple[bytes | None, bytes | None, Headers]], str]
KINDS: dict[str, Kind] = {
    "garbage": (lambda i, rng, p: (rng.randbytes(rng.randint(1, 64)) + b"\xff", None, []),
                "is declared json but the value does not parse"),
    "truncated": (lambda i, rng, p: (_dumps(_report(f"h-{i}", i, rng))[:-3], b"\xff\xfe", []),
                  "JSONDecodeError"),
    "deep": (lambda i, rng, p: (b"[" * 3_000, None, []), "RecursionError"),
    "tombstone": (lambda i, rng, p: (None, f"h-{i}".encode(), []), "has no value (a tombstone)"),
    "int-serial": (lambda i, rng, p: (_dumps(_report(i, i, rng)), None, []),
                   "stage 'per_robot': TypeError: key must be str, got int"),
    "surrogate": (lambda i, rng, p: (_dumps(_report(f"\ud800-{i}", i, rng)), None, []),
                  "is not valid UTF-8 text"),
    "no-seq": (lambda i, rng, p: (_dumps({"serial": f"h-{i}", "results": []}), None, []),
               "dedup: the sequence extractor raised KeyError"),
    "text-seq": (lambda i, rng, p: (_dumps(_report(f"h-{i}", "x1", rng)), None, []),
                 "dedup: the sequence must be an integer, got 'x1'"),
    "not-a-list": (lambda i, rng, p: (_dumps({"serial": f"h-{i}", "seq": i, "results": 5}),
                                      None, [("odd", b"\xff\xfe\x00")]),
                   "stage 'fastenings': TypeError"),
    "says-envelope": (lambda i, rng, p: (_dumps(_report(f"h-{i}", i, rng)), None,
                                         [("onceflow-format", b"envelope")]),
                      "holds onceflow envelopes"),
    "broken-chain": (lambda i, rng, p: (_dumps(_report(f"h-{i}", i, rng)), None,
                                        [("onceflow-chain", b"a/b/c")]),
                     "header onceflow-chain='a/b/c' (or onceflow-event-time-ms) does not parse"),
    "forged-chain": (lambda i, rng, p: (_dumps(_report(f"h-{i}", i, rng)), None,
                                        [("onceflow-chain", f"{{topic}}/{p}/999999999/0"
                                          .encode())]),
                     "forged or corrupt"),
    "header-name": (lambda i, rng, p: (_dumps(_report(f"h-{i}", i, rng)), None,
                                       [("site", b"a"), (RawName(b"\xff" + rng.randbytes(3)),
                                                         b"v")]),
                    "is not UTF-8 (Kafka header names are strings)"),
    "bad-event-time": (lambda i, rng, p: (_dumps(_report(f"h-{i}", i, rng)), None,
                                          [("onceflow-chain", b"elsewhere/0/1/0"),
                                           ("onceflow-event-time-ms", b"soon")]),
                       "does not parse"),
}


@dataclass
class Stream:
    messages: list[Message]
    truth: dict[str, Counter[str]]  # robot -> ok/failed counts of its distinct reports
    big: int  # hostile records larger than a fetch

    @property
    def hostile(self) -> int:
        return sum(m.reason is not None for m in self.messages)


def generate(topic: str, valid: int, hostile: int, partitions: int, robots: int, big: int,
             seed: int) -> Stream:
    """``valid`` reports (a few re-sent, as after a lost ack) and ``hostile`` records, mixed."""
    rng = random.Random(seed)
    seqs: Counter[str] = Counter()
    truth: dict[str, Counter[str]] = {}
    valid_messages: list[Message] = []
    for _ in range(valid):
        n = rng.randrange(robots)
        serial = f"r-{n}"
        report = _report(serial, seqs[serial], rng)
        seqs[serial] += 1
        counts = truth.setdefault(serial, Counter(ok=0, failed=0))
        counts.update("ok" if r["ok"] else "failed" for r in report["results"])
        message = Message(n % partitions, serial.encode(), _dumps(report))
        valid_messages.append(message)
        if rng.random() < 0.02:
            valid_messages.append(message)  # a re-send: dropped by the producer dedup
    bad: list[Message] = []
    names = sorted(KINDS)
    for i in range(hostile):
        make, reason = KINDS[names[i % len(names)]]
        partition = rng.randrange(partitions)
        value, key, headers = make(i, rng, partition)
        headers = [(h, v.replace(b"{topic}", topic.encode())) for h, v in headers]
        bad.append(Message(partition, key, value, headers, reason))
    for _ in range(big):
        bad.append(Message(rng.randrange(partitions), None, b"\xff" * BIG, [],
                           "is declared json but the value does not parse"))
    # Mix: hostile records at random places, valid ones keep their order.
    slots = sorted(rng.sample(range(len(valid_messages) + len(bad)), len(bad)))
    mixed: list[Message] = []
    bad_iter, valid_iter = iter(bad), iter(valid_messages)
    taken = set(slots)
    for position in range(len(valid_messages) + len(bad)):
        mixed.append(next(bad_iter) if position in taken else next(valid_iter))
    return Stream(mixed, truth, big)
