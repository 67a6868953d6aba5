"""An at-least-once device gateway, run as its own process by the e2e tests.

``python alo_producer.py BOOTSTRAP TOPIC STATE_FILE TOTAL RATE SEED``

Writes plain JSON device reports (``{"device": "d-17", "n": 3}``) keyed by
device, with the headers ``producer`` and ``seq``: event ``i`` is sequence
``i // PRODUCERS`` of producer ``gw-{i % PRODUCERS}``, and its payload is a
function of ``(SEED, i)`` only, so any copy of an event is byte-identical.
After each acknowledged batch it writes ``STATE_FILE`` (fsynced, atomically
renamed): the next event and the deliberate re-sends acknowledged so far.
Sends are paced at ``RATE`` events/s within each batch, so a batch is in
flight most of the time and a kill usually lands in the middle of one. SIGKILLed, it
resumes from that record, so the events of the batch it had not recorded are
sent again with the same sequences: an at-least-once re-send, as are the
~5% of records it sends twice on purpose (a copy of an acknowledged record
of the previous batch: a lost ack). Exits 0 once ``TOTAL`` events are
acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer

PRODUCERS = 3
DEVICES = 200
BATCH = 250
RESEND_RATE = 0.05
PACE = 25  # records sent between two pauses

Message = tuple[bytes, bytes, list[tuple[str, bytes]]]  # key, value, headers


def report(seed: int, i: int) -> dict[str, object]:
    """Event ``i``'s device report: the same for every copy of it."""
    rng = random.Random(seed * 1_000_003 + i)
    return {"device": f"d-{rng.randrange(DEVICES)}", "n": rng.randrange(1, 6)}


def message(seed: int, i: int) -> Message:
    value = report(seed, i)
    headers = [("producer", f"gw-{i % PRODUCERS}".encode()),
               ("seq", str(i // PRODUCERS).encode())]
    return str(value["device"]).encode(), json.dumps(value).encode(), headers


def load_state(path: Path) -> dict[str, int]:
    if not path.exists():
        return {"next": 0, "resent": 0}
    state: dict[str, int] = json.loads(path.read_text())
    return state


def save_state(path: Path, state: dict[str, int]) -> None:
    """Atomic and durable: the next start sees this record or the previous one."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as out:
        json.dump(state, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


async def run(bootstrap: str, topic: str, path: Path, total: int, rate: float,
              seed: int) -> None:
    state = load_state(path)
    rng = random.Random()  # which records are re-sent differs from run to run
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=5)
    await producer.start()
    try:
        previous: list[Message] = []  # the last acknowledged batch (lost on a kill)
        started, first = time.monotonic(), state["next"]
        while state["next"] < total:
            batch = [message(seed, i) for i in range(state["next"], min(state["next"] + BATCH,
                                                                          total))]
            resends = [m for m in previous if rng.random() < RESEND_RATE]
            out = list(batch)  # new records in sequence order; re-sends anywhere among them
            for copy in resends:
                out.insert(rng.randrange(len(out) + 1), copy)
            acks = []
            for k, (key, value, headers) in enumerate(out):
                acks.append(await producer.send(topic, value, key=key, headers=headers))
                if k % PACE == PACE - 1:  # paced within the batch: a kill lands mid-batch
                    sent = state["next"] - first + k * len(batch) / len(out)
                    await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))
            await asyncio.gather(*acks)
            state = {"next": state["next"] + len(batch), "resent": state["resent"] + len(resends)}
            save_state(path, state)
            previous = batch
    finally:
        await producer.stop()


if __name__ == "__main__":
    bootstrap, topic, state_file, total, rate, seed = sys.argv[1:]
    asyncio.run(run(bootstrap, topic, Path(state_file), int(total), float(rate), int(seed)))
