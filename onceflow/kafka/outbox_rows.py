"""The outbox's rows: a record stored as it would have been produced, under its lane and
a sequence number that orders the lane's rows across workers."""

from __future__ import annotations

import base64
import json
import time

from onceflow.stages.outcome import Output

__all__ = ["SeqClock", "decode_record", "encode_record", "lane_name"]


def encode_record(output: Output) -> bytes:
    """An outbox row: the record as it would have been produced (JSON, base64 bytes)."""
    b64 = base64.b64encode
    return json.dumps({
        "topic": output.topic,
        "key": None if output.key is None else b64(output.key).decode(),
        "value": b64(output.value).decode(),
        "headers": [[name, b64(value).decode()] for name, value in output.headers],
        "partition": output.partition,
    }).encode()


def decode_record(row: bytes) -> Output:
    d = json.loads(row)
    b64 = base64.b64decode
    return Output(d["topic"], None if d["key"] is None else b64(d["key"]), b64(d["value"]),
                  tuple((name, b64(value)) for name, value in d["headers"]), d.get("partition"))


def lane_name(topic: str, partition: int) -> str:
    return f"{topic}|{partition}"


class SeqClock:
    """Outbox sequence numbers: nanoseconds since the epoch, strictly increasing here.

    Every worker of a pipeline shares its outbox, and a restarted worker
    loads all of it (its own rows, and those of a worker that died and never
    came back). Time-based numbers never collide with another worker's and
    order a lane's rows across workers, as long as their clocks are closer
    than a rebalance takes (the assumption Cassandra's write timestamps
    already make).
    """

    def __init__(self) -> None:
        self.last = 0

    def __call__(self) -> int:
        self.last = max(time.time_ns(), self.last + 1)
        return self.last

    def take(self, n: int) -> range:
        """``n`` numbers at once, as ``n`` calls would give them with the clock standing
        still (one clock read per batch instead of per record)."""
        first = max(time.time_ns(), self.last + 1)
        self.last = first + n - 1
        return range(first, first + n)
