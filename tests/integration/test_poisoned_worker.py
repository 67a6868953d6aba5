"""A poisoned record never loops, with a real worker, broker and Redis (issue 29, 2).

A payments fold that returns a ``Decimal`` for some accounts used to fail the pipeline
actor at each snapshot (``Object of type Decimal is not JSON serializable``) and restart
the core for ever, healthy by /health, while nothing was committed. Now those records are
dead-lettered with the stage and the key, every other payment is folded exactly, and the
core never restarts. A stored state that is no state (garbage in its Redis key) stops the
worker at its load, exit 1, naming the stage, the key and the key in Redis, with /health
503 meanwhile: no restart can fix it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import redis
from helpers import committed, consume_all, create_topic, produce, stored_states

from onceflow.devtools import harness, services
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

APP = '''
import os
from decimal import Decimal

from onceflow.stages import Pipeline


def add(total, payment):
    """Cents per account; the "poison-" accounts are summed as a Decimal, as a payments
    team might, which no store can hold as JSON."""
    if payment["account"].startswith("poison-"):
        return Decimal(total) + Decimal(payment["cents"])
    return total + payment["cents"]


pipeline = (
    Pipeline("payments", topics=(os.environ["PAY_TOPIC"],), format="json")
    .aggregate("totals", key=lambda p: p["account"], init=int, fold=add)
)
'''
PARTITIONS = 2
#: Bounds on observable events: a caught-up worker, a stopped one. Generous for a loaded
#: host; a worker that loops (today's main) never gets there.
CAUGHT_UP, STOPPED = 90.0, 60.0


def payments(count: int) -> list[tuple[bytes, bytes]]:
    """Kafka-keyed by account (each account's payments on one partition); every 10th is
    for one of three poisoned accounts."""
    out = []
    for i in range(count):
        account = f"poison-{i % 3}" if i % 10 == 0 else f"acct-{i % 9}"
        out.append((account.encode(), json.dumps({"account": account, "cents": i}).encode()))
    return out


def worker(kafka: ServiceInfo, redis_url: str, names: Callable[..., str], tmp_path: Path,
           topic: str, extra: Mapping[str, str]) -> tuple[harness.WorkerProcess, str, str]:
    """A worker of the payments app: (its process, its group, its key prefix)."""
    group, prefix = names("g"), names("p")
    app = tmp_path / "app"
    app.mkdir(exist_ok=True)
    (app / "pay_app.py").write_text(APP)
    settings = {**redis_settings(kafka.address, redis_url, group, prefix),
                "onceflow.pipeline": "pay_app:pipeline", "onceflow.commit.interval": "500ms",
                **extra}
    env = {**os.environ, "PAY_TOPIC": topic,
           "PYTHONPATH": os.pathsep.join([str(app), os.environ.get("PYTHONPATH", "")])}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    return harness.WorkerProcess(argv, env, tmp_path), group, prefix


def test_unstorable_states_are_dead_lettered_and_every_other_record_folded_exactly(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, dead_topic = unique_name("pay"), unique_name("dead")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, PARTITIONS)
    create_topic(kafka_service.address, dead_topic, 1)
    messages = payments(600)
    ends = produce(kafka_service.address, topic, messages)
    pay, group, prefix = worker(kafka_service, redis_url, unique_name, tmp_path, topic,
                                {"onceflow.kafka.dead-letter-topic": dead_topic})
    pay.start()
    try:
        deadline = time.monotonic() + CAUGHT_UP
        while committed(kafka_service.address, group, topic, PARTITIONS) != ends:
            assert time.monotonic() < deadline, f"not caught up:{pay.log_tail()}"
            assert pay.exited() is None, f"exited {pay.exited()}:{pay.log_tail()}"
            time.sleep(0.5)
    finally:
        assert pay.terminate(timeout=30) == 0
    log = pay.logs[-1].read_text(errors="replace")
    assert "child core failed" not in log and "restarting" not in log, log[-3000:]

    truth: dict[str, int] = {}
    poisoned = {}
    for _, value in messages:
        payment = json.loads(value)
        if payment["account"].startswith("poison-"):
            poisoned[payment["cents"]] = payment["account"]
        else:
            truth[payment["account"]] = truth.get(payment["account"], 0) + payment["cents"]
    store = RedisStore(redis_url, prefix, "payments")
    try:
        assert stored_states(store, "totals") == truth  # no poisoned account was written
    finally:
        store.close()
    dead = consume_all(kafka_service.address, dead_topic, len(poisoned))
    assert len(dead) == len(poisoned) == 60
    reasons = {}
    for record in dead:
        headers = dict(record.headers)
        reasons[json.loads(record.value)["cents"]] = headers["onceflow.reason"].decode()
    assert reasons == {cents: (
        f"stage 'totals', key '{account}': UnstorableState: the state is not JSON-serialisable "
        "(TypeError: Object of type Decimal is not JSON serializable)")
        for cents, account in poisoned.items()}


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


@pytest.mark.parametrize(("stored", "why"), [
    (b"\x00garbage", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
    (b'{"v": 12, "w": [["orders", 0, "seven"]]}',  # JSON, but no onceflow step wrote it
     "TypeError: position 'seven' is not a list of offsets"),
])
def test_an_undecodable_stored_state_stops_the_worker_naming_its_row(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str], stored: bytes, why: str,
) -> None:
    topic = unique_name("pay")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, PARTITIONS)
    produce(kafka_service.address, topic, [(key, value) for key, value in payments(40)
                                           if not key.startswith(b"poison-")])
    port = services.free_port()
    pay, _, prefix = worker(kafka_service, redis_url, unique_name, tmp_path, topic, {
        "onceflow.metrics.port": str(port), "onceflow.supervision.escalation-grace": "3s"})
    row = f"{prefix}:payments:s:totals:acct-4"
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(row, stored)
    finally:
        client.close()
    pay.start()
    statuses: set[int | None] = set()
    deadline = time.monotonic() + STOPPED
    try:
        while pay.exited() is None:
            assert time.monotonic() < deadline, f"still running:{pay.log_tail()}"
            statuses.add(health(port))
            time.sleep(0.1)
    finally:
        if pay.exited() is None:
            with contextlib.suppress(Exception):
                pay.terminate(timeout=30)
    log = pay.logs[-1].read_text(errors="replace")
    assert pay.exited() == 1, log[-3000:]
    assert ("the stored state of stage 'totals', key 'acct-4' cannot be decoded "
            f"(not a onceflow state: {why}); its row: redis key '{row}'") in log, log[-3000:]
    assert "a restart cannot fix this: escalating" in log and "restarting" not in log
    assert 503 in statuses, statuses
