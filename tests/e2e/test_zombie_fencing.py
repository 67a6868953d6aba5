"""A zombie worker is fenced: its stale states never overwrite its successor's.

Worker A runs the robot pipeline (Redis) with a persistence interval far
longer than the test, so everything it folds stays in memory, unwritten. Once
it has folded the first part of the stream it is frozen (SIGSTOP) past its
session timeout; worker B joins, takes every partition over (and their next
epochs), folds both parts from the start, writes and commits them. Then A is
thawed (SIGCONT) holding stale states of every robot: its first write (the
flush of its revoke callback, or a persistence tick) must be refused
(``write fenced`` in its log, the ``fenced_writes`` stat), A restarts from
what is durable, rejoins, and the totals are exact. Without fencing
(``ONCEFLOW_FAULT_NO_FENCING=1`` in both workers) A's flush writes its stale
counts over B's and robots lose the second part. The same runs with the states in Cassandra
(fewer rounds: slower), where the epochs and the check are Cassandra's and the
rows are ordered by epoch; unfenced there, rows are ordered by the clock, as
before fencing.

The outputs rounds do the same to a pipeline with every kind of exclusive output
(``zombie_outputs``: an exclusive republish and late events): A is frozen in the
middle of the stream, B writes everything, and the thawed A, which still holds
batches and prefetched records, must produce none of them (its epochs are checked
before each batch of exclusive outputs): no record twice in the exclusive and
late-events topics, and the totals exact. Pauses that land between a check and
the send are counted from A's log (docs/guide/security.md, "Fencing": the residual window).
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers import expected_counts, stored_states

from onceflow.devtools import harness
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.base import StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore

PARTITIONS = 4
ROBOTS = 200
FIRST, SECOND = 1500, 6000  # reports in each part
ROUNDS = 3
CASSANDRA_ROUNDS = 2
STATS = re.compile(r"stats (\{.*\})")
FENCED = "write fenced"
ASSIGNED = "partitions assigned"
RESTARTING = "restarting ['core'"


def rejoined_after_restart(log: Path) -> bool:
    """The worker's pipeline restarted (after its fence) and its new consumer got partitions."""
    text = log.read_text(errors="replace")
    return RESTARTING in text and ASSIGNED in text.rsplit(RESTARTING, 1)[-1]


def stop_both(a: harness.WorkerProcess, b: harness.WorkerProcess) -> tuple[int | None, ...]:
    """SIGTERM each started worker (killed if it does not exit in time): none outlives a
    failed round."""
    return tuple(w.terminate(30) if w.logs else 0 for w in (a, b))


def records_processed(log: Path) -> int:
    """The ``records`` count of the worker's last stats line (0 before the first)."""
    lines = STATS.findall(log.read_text(errors="replace"))
    return int(ast.literal_eval(lines[-1]).get("records", 0)) if lines else 0


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def zombie_round(kafka: ServiceInfo, redis: ServiceInfo, workdir: Path,
                 unique_name: Callable[..., str], fenced: bool = True,
                 cassandra: ServiceInfo | None = None) -> tuple[dict, dict, str]:
    """One round on fresh topic, group and key prefix (or keyspace, with ``cassandra``):
    (stored totals, expected, A's log)."""
    bootstrap = kafka.address
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis.address}/0"
    asyncio.run(harness.create_topic(bootstrap, topic, PARTITIONS))
    first = generate(FIRST, robots=ROBOTS, seed=3)
    second = generate(SECOND, robots=ROBOTS, seed=4, after=first)
    common = {**redis_settings(bootstrap, redis_url, group, prefix),
              # A frozen worker's session expires in 3 s; joins take about half of it.
              "onceflow.kafka.session-timeout": "3s",
              "onceflow.kafka.heartbeat-interval": "1s",
              "onceflow.commit.interval": "1s",
              "onceflow.metrics.stats-interval": "300ms",
              "onceflow.supervision.backoff.initial": "200ms"}
    env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}
    keyspace = unique_name("ks")
    raw: list[str] = []  # --set values as HOCON, not strings
    if cassandra is not None:
        env["ONCEFLOW_ROBOTS_STORE"] = "cassandra"
        raw = ["--set", f'onceflow.stores.cassandra.contact-points=["{cassandra.host}"]']
        common |= {"onceflow.stores.cassandra.port": str(cassandra.port),
                   "onceflow.stores.cassandra.keyspace": keyspace,
                   "onceflow.stores.cassandra.protocol-version": "3"}
    config = harness.packaged_config("demo.conf")
    # A never writes on its own: every state it folds is unwritten when it is frozen. It
    # folds one record per batch, so once thawed it has folded only a little of the
    # second part when its session's loss makes it flush (the unfenced round then
    # writes stale counts; a faster A would catch up first and write the right ones).
    slow = {"onceflow.persistence.interval": "10m", "onceflow.kafka.max-poll-records": "1",
            "onceflow.consumer.max-in-flight-batches": "1"}
    if not fenced:  # both workers: on Cassandra, B's epoch timestamps alone would beat A's
        env["ONCEFLOW_FAULT_NO_FENCING"] = "1"
    a = harness.WorkerProcess(harness.worker_command(config, {**common, **slow}) + raw, env,
                              workdir, "a")
    b = harness.WorkerProcess(harness.worker_command(config, common) + raw, env, workdir, "b")

    async def scenario() -> None:
        await harness.produce(bootstrap, topic, first.messages)
        a.start()
        await until(lambda: records_processed(a.logs[-1]) >= len(first.messages), 60,
                    f"A to fold the first part; see {a.logs[-1]}")
        a.signal(signal.SIGSTOP)
        try:
            ends = await harness.produce(bootstrap, topic, second.messages)
            b.start()  # joins once A's session expired, and takes every partition
            async with harness.CommittedOffsets(bootstrap, group) as offsets:
                assert await offsets.wait_for(topic, ends, 90, b), f"B did not catch up: {b.logs}"
        finally:
            a.signal(signal.SIGCONT)
        if fenced:
            await until(lambda: FENCED in a.logs[-1].read_text(errors="replace"), 60,
                        f"A's write to be fenced; see {a.logs[-1]}")
            # The fence restarts A's pipeline; the new one joins and gets partitions.
            await until(lambda: rejoined_after_restart(a.logs[-1]), 60,
                        f"A to restart and rejoin; see {a.logs[-1]}")
        else:  # A flushes, then rejoins
            await until(lambda: a.logs[-1].read_text(errors="replace").count(ASSIGNED) >= 2,
                        60, f"A to rejoin; see {a.logs[-1]}")
        # A's stale write (or its refusal) came before its rejoin; after it A's writes
        # are its new incarnation's, from what is durable, and terminate() waits for them.

    try:
        asyncio.run(scenario())
    finally:
        codes = stop_both(a, b)
    assert codes == (0, 0), f"exit codes {codes}; see {workdir}"
    store: StateStore = RedisStore(redis_url, prefix, "robots") if cassandra is None else \
        CassandraStore([cassandra.host], "robots", port=cassandra.port, keyspace=keyspace,
                       protocol_version=3)
    try:
        stored = stored_states(store, "per_robot")
        stats = store.read_stats()
    finally:
        store.close()
    want = expected_counts(first.truth, second.truth)
    return stored, want, f"fenced_writes={stats.get('fenced_writes', 0)}, logs {a.logs + b.logs}"


def test_a_thawed_zombie_is_fenced_and_every_total_stays_exact(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    fenced_rounds(kafka_service, redis_service, tmp_path, unique_name, ROUNDS)


def test_a_thawed_zombie_is_fenced_on_cassandra_and_every_total_stays_exact(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, cassandra_service: ServiceInfo,
    tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    fenced_rounds(kafka_service, redis_service, tmp_path, unique_name, CASSANDRA_ROUNDS,
                  cassandra_service)


def fenced_rounds(kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                  unique_name: Callable[..., str], rounds: int,
                  cassandra: ServiceInfo | None = None) -> None:
    for round_ in range(rounds):
        workdir = tmp_path / f"round-{round_}"
        workdir.mkdir()
        stored, want, context = zombie_round(kafka, redis, workdir, unique_name,
                                             cassandra=cassandra)
        a_log = (workdir / "a-0.log").read_text(errors="replace")
        assert FENCED in a_log, f"round {round_}: {context}"
        # B, which took the partitions over properly, is never fenced.
        assert FENCED not in (workdir / "b-0.log").read_text(errors="replace"), context
        assert "fenced_writes=0" not in context, f"round {round_}: {context}"
        wrong = {robot for robot in want if stored.get(robot) != want[robot]}
        assert not wrong, f"round {round_}: {len(wrong)} robots off, e.g. " \
            f"{[(r, stored.get(r), want[r]) for r in sorted(wrong)[:3]]}; {context}"
        assert stored.keys() == want.keys(), f"round {round_}: {context}"


def test_without_fencing_the_thawed_zombie_overwrites_its_successor(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """The same round with the check off (fault injection): the test above can fail."""
    stored, want, context = zombie_round(kafka_service, redis_service, tmp_path, unique_name,
                                         fenced=False)
    wrong = [robot for robot in want if stored.get(robot) != want[robot]]
    print(f"unfenced zombie: {len(wrong)} of {len(want)} robots off; {context}")
    assert wrong, f"the unfenced zombie changed nothing: {context}"


def test_without_fencing_the_thawed_zombie_overwrites_its_successor_on_cassandra(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, cassandra_service: ServiceInfo,
    tmp_path: Path, unique_name: Callable[..., str],
) -> None:
    """The Cassandra round with the check off: the Cassandra test above can fail."""
    stored, want, context = zombie_round(kafka_service, redis_service, tmp_path, unique_name,
                                         fenced=False, cassandra=cassandra_service)
    wrong = [robot for robot in want if stored.get(robot) != want[robot]]
    print(f"unfenced zombie on Cassandra: {len(wrong)} of {len(want)} robots off; {context}")
    assert wrong, f"the unfenced zombie changed nothing: {context}"


# The outputs rounds: an exclusive republish and late events (``zombie_outputs``).
ITEMS = 20_000
KEYS = 40
LATE_FROM, LATE_EVERY = 6_000, 10  # from this item on, every 10th is 5 minutes late
BASE_MS = 1_700_000_000_000
OUTPUT_ROUNDS = 2
FROZEN_AT = 2_000  # A is frozen once it has processed at least this many items
PRODUCED_FENCED = "outputs not produced"
RECHECKED = "checked again before the produce request"
ACKED_LATE = "the fence's residual window"


def zombie_items() -> list[tuple[bytes | None, bytes]]:
    """Keyed by their aggregate key: a key's items all come from one partition."""
    items: list[tuple[bytes | None, bytes]] = []
    for i in range(ITEMS):
        t = BASE_MS + i * 100 - (300_000 if i >= LATE_FROM and i % LATE_EVERY == 0 else 0)
        key = f"k{i % KEYS}"
        items.append((key.encode(), json.dumps({"id": i, "k": key, "t": t}).encode()))
    return items


@dataclass
class OutputsRound:
    """What one outputs round wrote, and what A's log says of its fence checks."""

    pristine_copies: int
    pristine_missing: int
    late_events: int
    late_copies: int
    totals_exact: bool
    caught: int  # A's batches and produce requests refused by a check
    rechecked: int  # produce requests checked again (over 1 s after the last check)
    acked_late: int  # acknowledged over 1 s after their check: the residual window's bound
    dead_letters: int
    context: str


def outputs_round(kafka: ServiceInfo, redis: ServiceInfo, workdir: Path,
                  unique_name: Callable[..., str]) -> OutputsRound:
    bootstrap = kafka.address
    topic, pristine, late = unique_name("zin"), unique_name("zpristine"), unique_name("zlate")
    dead, group, prefix = unique_name("zdlq"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis.address}/0"
    for name in (topic, pristine, late, dead):
        asyncio.run(harness.create_topic(bootstrap, name, PARTITIONS))
    here = str(Path(__file__).parent)
    env = {**os.environ, "ONCEFLOW_ZOMBIE_TOPIC": topic, "ONCEFLOW_ZOMBIE_PRISTINE": pristine,
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    settings = {**redis_settings(bootstrap, redis_url, group, prefix),
                "onceflow.pipeline": "zombie_outputs:pipeline",
                "onceflow.kafka.dead-letter-topic": dead,
                "onceflow.kafka.late-events-topic": late,
                "onceflow.kafka.session-timeout": "3s",
                "onceflow.kafka.heartbeat-interval": "1s",
                "onceflow.commit.interval": "1s",
                "onceflow.metrics.stats-interval": "300ms",
                "onceflow.supervision.backoff.initial": "200ms",
                "onceflow.kafka.max-poll-records": "50"}
    config = harness.packaged_config("demo.conf")
    a = harness.WorkerProcess(harness.worker_command(config, settings), env, workdir, "a")
    b = harness.WorkerProcess(harness.worker_command(config, settings), env, workdir, "b")
    items = zombie_items()

    async def scenario() -> dict[int, int]:
        ends = await harness.produce(bootstrap, topic, items)
        a.start()
        await until(lambda: records_processed(a.logs[-1]) >= FROZEN_AT, 60,
                    f"A to process {FROZEN_AT} items; see {a.logs[-1]}")
        a.signal(signal.SIGSTOP)  # in the middle of the stream, batches in hand
        try:
            b.start()  # joins once A's session expired, takes every partition, writes all
            async with harness.CommittedOffsets(bootstrap, group) as offsets:
                assert await offsets.wait_for(topic, ends, 90, b), f"B did not catch up: {b.logs}"
        finally:
            a.signal(signal.SIGCONT)
        await until(lambda: FENCED in a.logs[-1].read_text(errors="replace"), 60,
                    f"A to be fenced; see {a.logs[-1]}")
        await until(lambda: rejoined_after_restart(a.logs[-1]), 60,
                    f"A to restart and rejoin; see {a.logs[-1]}")
        return ends

    try:
        ends = asyncio.run(scenario())
    finally:
        codes = stop_both(a, b)
    assert codes == (0, 0), f"exit codes {codes}; see {workdir}"
    assert records_processed(a.logs[-1]) < ITEMS, f"A was not frozen mid-stream: {a.logs}"
    written = asyncio.run(harness.read_all(bootstrap, pristine, PARTITIONS))
    ids = Counter(json.loads(record.value)["id"] for record in written)
    twice = sorted(i for i, n in ids.items() if n > 1)
    where = {i: [(r.partition, r.offset) for r in written if json.loads(r.value)["id"] == i]
             for i in twice[:3]}
    late_events = asyncio.run(harness.read_all(bootstrap, late, PARTITIONS))
    late_seen = Counter((record.value, tuple(record.headers)) for record in late_events)
    store = RedisStore(redis_url, prefix, "zombie-outputs")
    try:
        totals = stored_states(store, "total")
    finally:
        store.close()
    want = Counter(f"k{i % KEYS}" for i in range(ITEMS))
    a_log = "".join(log.read_text(errors="replace") for log in a.logs)
    return OutputsRound(
        pristine_copies=sum(n - 1 for n in ids.values()),
        pristine_missing=ITEMS - len(ids),
        late_events=len(late_seen),
        late_copies=sum(n - 1 for n in late_seen.values()),
        totals_exact=totals == dict(want),
        caught=a_log.count(PRODUCED_FENCED),
        rechecked=a_log.count(RECHECKED),
        acked_late=a_log.count(ACKED_LATE),
        dead_letters=len(asyncio.run(harness.read_all(bootstrap, dead, PARTITIONS, quiet=0.5))),
        context=f"ends {ends}; copies (partition, offset): {where}; logs {a.logs + b.logs}")


def test_a_thawed_zombie_produces_no_exclusive_output_twice(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """0 copies in the exclusive republish and late-events topics, totals exact; how often
    a pause landed in the residual window (between a check and the send) is printed."""
    rounds = []
    for round_ in range(OUTPUT_ROUNDS):
        workdir = tmp_path / f"outputs-{round_}"
        workdir.mkdir()
        result = outputs_round(kafka_service, redis_service, workdir, unique_name)
        rounds.append(result)
        print(f"outputs round {round_}: {result}")
        assert result.pristine_copies == 0 and result.late_copies == 0, \
            f"round {round_}: the zombie wrote copies: {result}"
        assert result.pristine_missing == 0 and result.totals_exact, f"round {round_}: {result}"
        assert result.late_events > 0 and result.dead_letters == 0, f"round {round_}: {result}"
    # A pause between the last check and the write of a produce request (the residual
    # window) would show as copies above; the re-checks are the pauses that landed
    # between a batch's check and its send, and were caught.
    print(f"produce requests checked again after a pause: {[r.rechecked for r in rounds]}; "
          f"refused by a check: {[r.caught for r in rounds]}; acknowledged over 1 s after "
          f"their check (the residual window's bound): {[r.acked_late for r in rounds]}; "
          f"copies: 0 in {len(rounds)} rounds")
