"""A zombie join worker is fenced: its late merge-log appends order nothing, its states
are refused, and every per-category total is what the payments' first processing met.

Payments are joined with a merchants table that keeps changing category
(``join_payments``: the enriched payments republished, then totalled per category
through a repartition). Worker A runs alone with a persistence interval far longer than
the test: everything it applies stays in memory, its offsets are never committed, but
each run it applies is in the merge log first. A is frozen (SIGSTOP) past its session
timeout; B joins, takes every partition over (and their next epochs), reads the log
(writing its mark), replays A's logged runs in their order from offset 0 and appends
runs of its own. Then A is thawed (SIGCONT) and must be refused (``write fenced``); it
restarts from what is durable and rejoins, and is then replaced by a worker like B (its
10-minute interval would commit nothing). Two rounds:

- idle: A applied the first half of the input (outputs settled); B replays it and
  commits; the thawed A, with no record in hand, flushes on its revoke: the snapshot of
  its stale states is refused (``fenced_writes``). The second half comes after.
- busy: A is frozen while both topics are produced, batches in hand; B appends the
  runs of what A had not logged; the thawed A's next append is refused by its epoch
  check, or its outputs by the producer's re-check after the pause; an append of A's
  that passed its check before the freeze may land after B's mark (a late append).
  The thawed A's revoke drops its partitions from its fence (its flush fails: the
  pipeline actor is down), so its outputs' own partitions are checked before each
  produce request (``ProduceGate``): checking only the epochs still held passed with
  none left, and a late append's payments went out under a second category (CI once;
  3 of 58 runs by hand before the fix).

Checked: every emission of a payment in the enriched topic carries one category (a run
A applied but nobody else replayed in its order, or a late append of A's replayed by
someone after B's runs, would give a payment a second category, or make the replay wait
for records below its position for ever: not drained); every category's total is the
sum of the payments emitted under it; the totals over all categories are the input's;
the appends of A's epoch that landed after B's mark (its late appends) count for no
reader (``decode_all``). ``zombie_join_round(..., fenced=False)`` runs a round with
``ONCEFLOW_FAULT_NO_FENCING=1`` in both workers (epochs 0, nothing checked): in 9 of 16
such rounds run by hand (four ways of staging it), payments met two versions of their
row or a category's total was off (A's outputs, appends or stale states counted); in
the others A's ledger refused its revoke for unwritten records, or B's later writes
covered A's. Too uncertain for a test of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import create_topic, stored_states
from test_zombie_fencing import records_processed, rejoined_after_restart, until

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.kafka.merge_log_topic import decode_all, merge_log_topic
from onceflow.protos.envelope_pb2 import Envelope
from onceflow.stages.merge_log import Run
from onceflow.stores.redis_store import RedisStore

PARTITIONS = 4
MERCHANTS = [f"m{i}" for i in range(40)]
CATEGORIES = ["food", "travel", "toys", "books", "fuel"]
PAYMENTS, UPDATES = 4000, 400
SPREAD = 12.0  # seconds over which payments and updates are produced
FROZEN_AT = 800  # A is frozen once it has processed at least this many records
HERE = str(Path(__file__).parent)
FENCED = "write fenced"
PRODUCE_FENCED = "outputs not produced"


@dataclass
class ZombieJoin:
    """What one round left: emissions per payment, stored totals, the merge log, logs."""

    payments: list[dict[str, Any]]
    emitted: dict[int, set[str]]
    totals: dict[str, dict[str, int]]
    log: dict[int, list[tuple[int, bytes]]]  # merge log partition -> (offset, value)
    drained: bool  # every payment, and every record of the repartition topic, committed
    fenced_writes: int
    a_log: str
    others_log: str  # B and the worker that replaced A
    context: str


def zombie_join_round(kafka: ServiceInfo, redis: ServiceInfo, workdir: Path,
                      unique_name: Callable[..., str], idle: bool,
                      fenced: bool = True) -> ZombieJoin:
    """One round on fresh topics, group, key prefix and merge log. ``idle``: A is frozen
    once it applied the first half of the input (outputs settled, states unwritten: the
    thawed A's first write is a snapshot); else while it processes the second half
    (batches and appends in hand)."""
    rng = random.Random(random.SystemRandom().randrange(10**6))
    bootstrap = kafka.address
    pay, merch, out, hop = (unique_name("pay"), unique_name("merch"), unique_name("out"),
                            unique_name("hop"))
    pipeline_id, group, prefix = unique_name("jz"), unique_name("g"), unique_name("p")
    for topic in (pay, merch, out, hop):
        create_topic(bootstrap, topic, PARTITIONS)
    redis_url = f"redis://{redis.address}/0"
    common = {"onceflow.pipeline": "join_payments:pipeline",
              "onceflow.kafka.bootstrap-servers": bootstrap,
              "onceflow.kafka.group-id": group,
              "onceflow.stores.redis.url": redis_url,
              "onceflow.stores.redis.key-prefix": prefix,
              # A frozen worker's session expires in 3 s; joins take about half of it.
              "onceflow.kafka.session-timeout": "3s",
              "onceflow.kafka.heartbeat-interval": "1s",
              "onceflow.commit.interval": "1s",
              "onceflow.metrics.stats-interval": "300ms",
              "onceflow.supervision.backoff.initial": "200ms"}
    # A writes and commits nothing on its own: B replays A's whole log, and the thawed A
    # holds states and runs of every partition that are no longer its own.
    slow = {"onceflow.persistence.interval": "10m", "onceflow.kafka.max-poll-records": "20",
            "onceflow.consumer.max-in-flight-batches": "1"}
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ONCEFLOW_JOIN_ID": pipeline_id,
           "ONCEFLOW_JOIN_PAYMENTS": pay, "ONCEFLOW_JOIN_MERCHANTS": merch,
           "ONCEFLOW_JOIN_OUTPUT": out, "ONCEFLOW_JOIN_HOP": hop}
    if not fenced:  # both workers: epochs 0, no check of states, outputs or appends
        env["ONCEFLOW_FAULT_NO_FENCING"] = "1"
    config = harness.packaged_config("demo.conf")
    a = harness.WorkerProcess(harness.worker_command(config, {**common, **slow}), env,
                              workdir, "a")
    b = harness.WorkerProcess(harness.worker_command(config, common), env, workdir, "b")
    a2 = harness.WorkerProcess(harness.worker_command(config, common), env, workdir, "a2")
    stopped: list[int | None] = []  # A's exit code
    rows = [(m.encode(), json.dumps({"cat": rng.choice(CATEGORIES)}).encode())
            for m in MERCHANTS]
    updates = [(m.encode(), json.dumps({"cat": rng.choice(CATEGORIES)}).encode())
               for m in (rng.choice(MERCHANTS) for _ in range(UPDATES))]
    payments: list[dict[str, Any]] = [
        {"id": i, "merchant": rng.choice(MERCHANTS), "amount": rng.randint(1, 100)}
        for i in range(PAYMENTS)]
    keyed = [(str(p["merchant"]).encode(), json.dumps(p).encode()) for p in payments]
    first = len(payments) // 2, len(updates) // 2  # produced before A starts

    async def scenario() -> tuple[dict[int, int], bool]:
        await harness.produce(bootstrap, merch, rows + updates[:first[1]])
        ends = await harness.produce(bootstrap, pay, keyed[:first[0]])
        a.start()
        if idle:  # A applied the first part, its outputs settled, its states unwritten
            done = len(rows) + first[1] + 2 * first[0]  # the payments twice: pay, then hop
            await until(lambda: records_processed(a.logs[-1]) >= done, 60,
                        f"A to process the first part; see {a.logs[-1]}")
            a.signal(signal.SIGSTOP)
            try:  # B replays A's log and commits; the thawed A gets no record before its
                b.start()  # revoke's flush offers its stale states
                async with harness.CommittedOffsets(bootstrap, group) as offsets:
                    assert await offsets.wait_for(pay, ends, 90, b), f"B: {b.logs}"
            finally:
                a.signal(signal.SIGCONT)
        else:
            paying = asyncio.create_task(harness.produce(bootstrap, pay, keyed[first[0]:],
                                                         SPREAD))
            changing = asyncio.create_task(harness.produce(bootstrap, merch,
                                                           updates[first[1]:], SPREAD))
            await until(lambda: records_processed(a.logs[-1]) >= FROZEN_AT, 60,
                        f"A to process {FROZEN_AT} records; see {a.logs[-1]}")
            a.signal(signal.SIGSTOP)  # in the middle of both topics, batches in hand
            try:
                b.start()  # joins once A's session expired, takes every partition
                deadline = time.monotonic() + 90
                while not successors_appends(await read_log(bootstrap, pipeline_id)):
                    assert time.monotonic() < deadline, f"B never appended; see {b.logs}"
            finally:
                a.signal(signal.SIGCONT)
        if fenced:
            await until(lambda: FENCED in a.logs[-1].read_text(errors="replace"), 60,
                        f"A to be fenced; see {a.logs[-1]}")
        await until(lambda: rejoined_after_restart(a.logs[-1]) or
                    a.logs[-1].read_text(errors="replace").count("partitions assigned") >= 2,
                    60, f"A to rejoin; see {a.logs[-1]}")
        # A's next incarnation holds partitions rightly, but would commit nothing for 10
        # minutes: it stops (flushing and committing) and a worker like B replaces it.
        stopped.append(a.terminate(30))
        a2.start()
        if idle:  # the second part, to both
            paying = asyncio.create_task(harness.produce(bootstrap, pay, keyed[first[0]:],
                                                         SPREAD / 3))
            changing = asyncio.create_task(harness.produce(bootstrap, merch,
                                                           updates[first[1]:], SPREAD / 3))
        await changing
        ends = await paying
        wait = 120 if fenced else 45  # unfenced, a replay may wait for good
        async with harness.CommittedOffsets(bootstrap, group) as offsets:
            if not await offsets.wait_for(pay, ends, wait):
                return ends, False
            hop_ends = await harness.read_ends(bootstrap, hop, PARTITIONS, quiet=1.0)
            return ends, await offsets.wait_for(hop, hop_ends, wait)

    try:
        ends, drained = asyncio.run(scenario())
    finally:
        if not stopped and a.logs:
            stopped.append(a.terminate(30))
        codes = (*stopped, *(w.terminate(30) if w.logs else 0 for w in (a2, b)))
    assert codes == (0, 0, 0), f"exit codes {codes}; see {workdir}"
    emitted: dict[int, set[str]] = {}
    for record in asyncio.run(harness.read_all(bootstrap, out, PARTITIONS, quiet=1.0)):
        value = json.loads(Envelope.FromString(record.value or b"").payload)
        emitted.setdefault(value["id"], set()).add(str(value["cat"]))
    store = RedisStore(redis_url, prefix, pipeline_id)
    try:
        totals = stored_states(store, "totals")
        fenced_writes = int(store.read_stats().get("fenced_writes", 0))
    finally:
        store.close()
    return ZombieJoin(payments, emitted, totals, asyncio.run(read_log(bootstrap, pipeline_id)),
                      drained, fenced_writes,
                      "".join(p.read_text(errors="replace") for p in a.logs),
                      "".join(p.read_text(errors="replace") for p in b.logs + a2.logs),
                      f"ends {ends}; logs {a.logs + b.logs + a2.logs}")


async def read_log(bootstrap: str, pipeline_id: str) -> dict[int, list[tuple[int, bytes]]]:
    """The merge log as written: partition -> its (offset, value) records."""
    found: dict[int, list[tuple[int, bytes]]] = {}
    records = await harness.read_all(bootstrap, merge_log_topic(pipeline_id), PARTITIONS,
                                     quiet=0.5)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        found.setdefault(record.partition, []).append((record.offset, record.value or b""))
    return found


def successors_appends(log: dict[int, list[tuple[int, bytes]]]) -> dict[int, int]:
    """Per partition, how many appends with runs follow its second reader's mark: A read
    each partition once (its first mark), so these follow B's read (with fencing, under
    B's higher epoch; A's own late ones are ``late_appends``)."""
    found = {}
    for partition, records in log.items():
        docs = [json.loads(value) for _, value in records]
        marks = [i for i, doc in enumerate(docs) if "a" in doc]
        if len(marks) >= 2:
            count = sum(1 for doc in docs[marks[1]:] if doc["r"])
            if count:
                found[partition] = count
    return found


def late_appends(records: list[tuple[int, bytes]]) -> list[tuple[int, dict[str, Any]]]:
    """A partition's appends (with runs) that landed after a mark of a higher epoch: a
    zombie's, written after its successor read the log."""
    late, marked = [], -1  # the highest epoch of a mark so far
    for offset, value in records:
        doc = json.loads(value)
        if "a" in doc:
            marked = max(marked, int(doc["e"]))
        elif doc["r"] and int(doc["e"]) < marked:
            late.append((offset, doc))
    return late


def test_a_thawed_zombie_join_is_fenced_and_every_category_total_is_exact(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """Two rounds: A frozen idle (its first write once thawed is its stale states), and
    frozen in the middle of the stream (its appends and outputs in hand)."""
    for idle in (True, False):
        workdir = tmp_path / ("idle" if idle else "busy")
        workdir.mkdir()
        got = zombie_join_round(kafka_service, redis_service, workdir, unique_name, idle)
        context = f"{'idle' if idle else 'busy'} round: {got.context}"
        # The takeover happened as staged: B appended after its read of the log, A was
        # refused once thawed, and B never was.
        assert successors_appends(got.log), f"B never appended: {context}"
        assert FENCED in got.a_log, context
        assert FENCED not in got.others_log, context
        if idle:  # A's stale states were offered to the store, and refused
            assert got.fenced_writes > 0, context
        else:
            assert records_processed(workdir / "a-0.log") < 2 * PAYMENTS + UPDATES, context
        # A's appends that landed after B's mark (if any) are read by nobody.
        late = {p: late_appends(records) for p, records in got.log.items()}
        for partition, records in got.log.items():
            kept = set(decode_all(records))
            for _, doc in late[partition]:
                read = [run for run in doc["r"] if Run(*run) in kept]  # [topic, first, last]
                assert not read, f"partition {partition}: a late append is read: {doc}"
        print(f"zombie join, {'idle' if idle else 'busy'} round: late appends of A "
              f"{sum(map(len, late.values()))}, refused snapshots {got.fenced_writes}, "
              f"refused produce requests {got.a_log.count(PRODUCE_FENCED)}, merge log "
              f"records {sum(map(len, got.log.values()))}")
        check_totals(got)


def check_totals(got: ZombieJoin) -> None:
    """Each payment emitted under one category, every category's total the sum of the
    payments emitted under it, the totals over all categories the input's."""
    context = got.context
    assert got.drained, f"the input was not drained: {context}"
    assert len(got.emitted) == len(got.payments), context
    split = {i: cats for i, cats in got.emitted.items() if len(cats) > 1}
    assert split == {}, f"payments that met two versions of their row: {split}; {context}"
    truth: dict[str, dict[str, int]] = {}
    for payment in got.payments:
        (category,) = got.emitted[payment["id"]]
        total = truth.setdefault(category, {"n": 0, "amount": 0})
        total["n"] += 1
        total["amount"] += payment["amount"]
    assert got.totals == truth, context
    assert sum(t["amount"] for t in got.totals.values()) == \
        sum(p["amount"] for p in got.payments), context
    assert sum(t["n"] for t in got.totals.values()) == len(got.payments), context
