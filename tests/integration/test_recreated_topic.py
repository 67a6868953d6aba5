"""A partition whose log ends below the offset its group committed stops the worker.

That happens when a log is truncated (an unclean leader election) or restarts
(a topic deleted and re-created on a broker that kept the group's offsets).
Counted on, its new records would sit below the watermarks the old ones left
and be discarded as copies: a silent loss. Real Kafka answers the committed
offset with OFFSET_OUT_OF_RANGE and the client resets to the start, so
records come below the assigned position (a unit test of ``Continuity``);
Tansu answers with an empty fetch and a high watermark below it. Neither
broker can truncate a log here, so the test commits an offset beyond the end
itself, as a truncation would leave it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from helpers import (
    committed,
    create_topic,
    exit_code_within,
    expected_counts,
    produce,
    start_worker,
    stored_states,
)

from onceflow.devtools import harness
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo, free_port
from onceflow.stores.base import StateStore
from onceflow.stores.cassandra_store import CassandraStore
from onceflow.stores.redis_store import RedisStore


async def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.commit({TopicPartition(topic, 0): offset})
    finally:
        await consumer.stop()


def _stopped_with_1(worker: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    """Wait up to ``timeout`` s for ``worker`` to stop on its own (killed if it has not),
    check it exited 1 (the refusal's code), and answer its log."""
    code = exit_code_within(worker, timeout, log, "not stopped")
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    return text


def test_a_log_ending_below_the_committed_offset_stops_the_worker(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap, redis_url = kafka_service.address, f"redis://{redis_service.address}/0"
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    stream = generate(50, robots=5, seed=4)
    create_topic(bootstrap, topic, 1)
    ends = produce(bootstrap, topic, stream.messages)
    asyncio.run(_commit(bootstrap, group, topic, 400))
    log = tmp_path / "worker.log"
    started = time.monotonic()
    worker = start_worker(bootstrap, redis_url, group, prefix, topic, log,
                          ["--set", "onceflow.consumer.rewind-grace=2s"])
    text = _stopped_with_1(worker, log, 90)
    assert f"{topic}[0] ends at offset {ends[0]}, below offset 400" in text, text[-3000:]
    assert time.monotonic() - started > 2  # not before the grace
    # Nothing was folded, nothing committed: the group still holds its offset.
    store = RedisStore(redis_url, prefix, "robots")
    try:
        assert list(store.scan("per_robot")) == []
    finally:
        store.close()
    assert committed(bootstrap, group, topic, 1) == {0: 400}


# -- a topic deleted and re-created under its name (issue 29, reproduction 5) -----------

REFUSED = re.compile(r"(\S+)\[(\d+)\] is not the log this pipeline's states were folded "
                     r"from: they hold its records up to offset (\d+), and (it now ends at "
                     r"offset (\d+)|its record at offset \d+ differs)")


async def _recreate(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again under its name (the group's offsets go too)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while topic in await admin.list_topics():
            assert time.monotonic() < deadline, f"{topic} still listed after delete"
            await asyncio.sleep(0.2)
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


class Target:
    """One robot topic and group, and the store its worker keeps the states in."""

    def __init__(self, request: pytest.FixtureRequest, kind: str, kafka: ServiceInfo,
                 unique_name: Callable[..., str], tmp_path: Path) -> None:
        self.kind, self.bootstrap, self.tmp_path = kind, kafka.address, tmp_path
        self.topic, self.group = unique_name("robots"), unique_name("g")
        self.prefix = unique_name("p")
        self.dead_letters = unique_name("dead")  # exclusive: a replay skips those written
        create_topic(self.bootstrap, self.dead_letters, 2)
        self.env = {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": self.topic}
        if kind == "redis":
            redis: ServiceInfo = request.getfixturevalue("redis_service")
            self.redis_url, self.store_args = f"redis://{redis.address}/0", []
            self.open: Callable[[], StateStore] = lambda: RedisStore(
                self.redis_url, self.prefix, "robots")
        else:
            cassandra: ServiceInfo = request.getfixturevalue("cassandra_service")
            keyspace = unique_name("ks")
            self.redis_url = f"redis://127.0.0.1:{free_port()}/0"  # never needed
            self.env["ONCEFLOW_ROBOTS_STORE"] = "cassandra"
            self.store_args = [arg for key, value in {
                "contact-points": f'["{cassandra.host}"]', "port": str(cassandra.port),
                "keyspace": f'"{keyspace}"', "protocol-version": "3"}.items()
                for arg in ("--set", f"onceflow.stores.cassandra.{key}={value}")]
            self.open = lambda: CassandraStore([cassandra.host], "robots", port=cassandra.port,
                                               keyspace=keyspace, protocol_version=3)

    def argv(self, command: str) -> list[str]:
        argv = harness.worker_command(harness.packaged_config("demo.conf"), redis_settings(
            self.bootstrap, self.redis_url, self.group, self.prefix))
        argv[argv.index("run")] = command
        return [*argv, *self.store_args,
                "--set", f"onceflow.kafka.dead-letter-topic={self.dead_letters}"]

    def dead_lettered(self) -> list[str]:
        """The source (``topic/partition/offset``) of each dead letter, in topic order."""
        records = asyncio.run(harness.read_all(self.bootstrap, self.dead_letters, 2, quiet=1.0))
        return [dict(r.headers)["onceflow.source"].decode() for r in records]

    def start(self, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(self.argv("run"), env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT)

    def committed(self) -> dict[int, int]:
        return committed(self.bootstrap, self.group, self.topic, 2)

    def drain(self, log: Path, ends: dict[int, int]) -> None:
        """Run a worker until the group committed ``ends``, then SIGTERM it (exit 0)."""
        worker = self.start(log)
        try:
            deadline = time.monotonic() + 120
            while self.committed() != {p: ends.get(p, 0) for p in range(2)}:
                assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
                time.sleep(0.3)
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0, log.read_text(errors="replace")[-3000:]
        finally:
            if worker.poll() is None:
                worker.kill()

    def totals(self) -> dict[str, object]:
        store = self.open()
        try:
            return stored_states(store, "per_robot")
        finally:
            store.close()


@pytest.mark.parametrize(("kind", "new_messages"), [
    ("redis", 60), ("redis", 900), ("cassandra", 900)],
    ids=["redis-shorter", "redis-grown_past", "cassandra-grown_past"])
def test_a_topic_recreated_under_its_name_is_refused_until_forgotten_then_counted_exactly(
    request: pytest.FixtureRequest, kafka_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str], kind: str, new_messages: int,
) -> None:
    """Reproduction 5: a real delete + create (Tansu keeps no group offsets for the new
    topic, as Kafka). Whether the new log is shorter than the old offsets or has already
    grown past them, the worker refuses it (exit 1, topic, partition, both offsets, the
    two ways out) and changes nothing; after ``onceflow forget --topic T`` the new
    topic's events (their producer sequences restarting at 0) are counted exactly."""
    run = Target(request, kind, kafka_service, unique_name, tmp_path)
    bootstrap, topic = run.bootstrap, run.topic
    old = generate(400, robots=12, seed=21)
    create_topic(bootstrap, topic, 2)
    bad = (b"bad", b"{not json")  # first in both logs: one partition, offset 0 in each
    old_ends = produce(bootstrap, topic, [bad, *old.messages])
    run.drain(tmp_path / "old.log", old_ends)
    assert run.totals() == expected_counts(old.truth)
    assert len(run.dead_lettered()) == 1

    asyncio.run(_recreate(bootstrap, topic, 2))
    new = generate(new_messages, robots=12, seed=22)  # sequences restart at 0
    new_ends = produce(bootstrap, topic, [bad, *new.messages])
    if new_messages > 400:
        assert all(new_ends[p] > old_ends[p] for p in old_ends)  # grown past the old log
    else:
        assert all(new_ends[p] < old_ends[p] - 1 for p in old_ends)

    log = tmp_path / "refused.log"
    text = _stopped_with_1(run.start(log), log, 60)
    found = REFUSED.search(text)
    assert found is not None, text[-3000:]
    assert found[1] == topic
    partition, held = int(found[2]), int(found[3])
    assert held == old_ends[partition] - 1
    if new_messages > 400:
        assert "differs" in found[4]
    else:
        assert int(found[5]) == new_ends[partition]
    assert "a new name" in text and f"onceflow forget --topic {topic}" in text
    assert run.totals() == expected_counts(old.truth)  # nothing discarded, nothing folded
    assert run.committed() == {0: 0, 1: 0}  # nothing committed

    forgot = subprocess.run([*run.argv("forget"), "--topic", topic], capture_output=True,
                            text=True, env=run.env, timeout=120)
    assert forgot.returncode == 0, forgot.stderr[-3000:]
    assert f"forget {topic}:" in forgot.stderr  # logged
    summary = json.loads(forgot.stdout)
    assert summary["partitions"] == [0, 1] and summary["watermarks"] > 0

    run.drain(tmp_path / "new.log", new_ends)
    assert run.totals() == expected_counts(old.truth, new.truth)
    # the new log's bad record sits at the old one's offset: dead-lettered all the same
    # (read in the log's generation, the old dead letter is older than all of it)
    sources = run.dead_lettered()
    assert len(sources) == 2 and sources[0] == sources[1], sources


def test_a_topic_recreated_under_a_running_worker_is_refused_before_any_of_it_is_written(
    request: pytest.FixtureRequest, kafka_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """The worker holds its partitions, caught up, when the topic is deleted and re-created
    and its new log grows past the old offsets: no assignment happens, and the broker
    serves the new log from the old position. It used to fold those records as if they
    followed the old ones and never read the new log below them, silently. Now the
    check of the logs (``checkpoint.log_watch``) stops the worker (exit 1) before
    anything of the new log is written, committed or sent (a bad record's dead letter
    waits for it too: sent before, it was sent again after the forget); after
    ``forget`` the new log is counted exactly, its bad record dead-lettered once."""
    run = Target(request, "redis", kafka_service, unique_name, tmp_path)
    bootstrap, topic = run.bootstrap, run.topic
    old = generate(400, robots=12, seed=21)
    create_topic(bootstrap, topic, 2)
    old_ends = produce(bootstrap, topic, old.messages)
    log = tmp_path / "running.log"
    worker = run.start(log)
    try:
        deadline = time.monotonic() + 120
        while run.committed() != old_ends:
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.3)
        asyncio.run(_recreate(bootstrap, topic, 2))
        new = generate(900, robots=12, seed=22)
        bad = (b"bad", b"{not json")  # past the old log's end: read before any check
        new_ends = produce(bootstrap, topic, [*new.messages, bad])
        assert all(new_ends[p] > old_ends[p] for p in old_ends)  # grown past the old log
        text = _stopped_with_1(worker, log, 60)
    finally:
        if worker.poll() is None:
            worker.kill()
    found = REFUSED.search(text)
    assert found is not None, text[-3000:]
    assert found[1] == topic and "differs" in found[4]
    assert int(found[3]) == old_ends[int(found[2])] - 1
    assert run.totals() == expected_counts(old.truth)  # nothing of the new log written
    assert run.committed() == {0: 0, 1: 0}  # nor committed
    assert run.dead_lettered() == []  # nor sent: its dead letter waited for the check

    forgot = subprocess.run([*run.argv("forget"), "--topic", topic], capture_output=True,
                            text=True, env=run.env, timeout=120)
    assert forgot.returncode == 0, forgot.stderr[-3000:]
    run.drain(tmp_path / "new.log", new_ends)
    assert run.totals() == expected_counts(old.truth, new.truth)
    assert len(run.dead_lettered()) == 1  # once, after the forget
