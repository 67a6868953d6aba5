"""A store-less republisher refuses its input topic re-created under its name, until
``onceflow forget --topic T``; then every new record is republished, and an aggregate
reading its output counts every one without a forget of its own.

Without a store it kept no log marks: after a delete and create (the group's
offsets go with the topic) it read the new log from 0 and republished the new
records with the source chains of the old ones, (topic, partition, offset) alike,
and every aggregate downstream discarded them as copies, silently. Its marks now
live in ``<pipeline>-log-marks`` (``kafka.log_marks_topic``), and the forget counts the
log's generation up there: the new records are republished with roots above the old
ones (``lineage.root_offset``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import caught_up, committed, create_topic, produce, stored_states
from test_recreated_topic import REFUSED, _recreate, _stopped_with_1

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

PIPELINE = '''
import os
from onceflow import Pipeline

pipeline = (
    Pipeline(os.environ["RELAY_ID"], topics=(os.environ["RELAY_TOPIC"],), format="json")
    .map("tag", lambda item: {**item, "relayed": True})
    .republish("out", os.environ["RELAY_OUTPUT"], key=lambda item: str(item["id"]),
               format="json", exclusive=os.environ["RELAY_EXCLUSIVE"] == "1")
)

# Downstream: per item id (the republish key: each fed from one partition, its home), how
# many times it counted an item of each generation (old, new), in Redis. The new log's
# ids are the old log's again, at the same offsets: the same states, the same roots.
counts = (
    Pipeline(os.environ["COUNT_ID"], topics=(os.environ["RELAY_OUTPUT"],), format="json")
    .aggregate("seen", key=lambda item: str(item["id"]), init=dict,
               fold=lambda seen, item: {**seen, item["gen"]: seen.get(item["gen"], 0) + 1})
)
'''
PARTITIONS = 2


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens once the socket is closed


def items(generation: str, first: int, count: int) -> list[tuple[bytes | None, bytes]]:
    return [(str(i).encode(), json.dumps({"id": i, "gen": generation}).encode())
            for i in range(first, first + count)]


class Relay:
    """The relay (store-less, its marks in ``<pipeline>-log-marks``) over 120 old items,
    and the aggregate downstream that counts what it republished."""

    def __init__(self, kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                 unique_name: Callable[..., str], exclusive: bool) -> None:
        self.bootstrap, self.tmp_path = kafka.address, tmp_path
        self.topic, self.output = unique_name("relay_in"), unique_name("relay_out")
        self.group, self.pipeline_id = unique_name("g"), unique_name("relay")
        (tmp_path / "relay_pipeline.py").write_text(textwrap.dedent(PIPELINE))
        nowhere = closed_port()
        settings = {"onceflow.pipeline": "relay_pipeline:pipeline",
                    "onceflow.kafka.bootstrap-servers": self.bootstrap,
                    "onceflow.kafka.group-id": self.group,
                    "onceflow.stores.redis.url": f"redis://127.0.0.1:{nowhere}/0",
                    "onceflow.stores.cassandra.contact-points": "127.0.0.1",
                    "onceflow.stores.cassandra.port": str(nowhere),
                    "onceflow.commit.interval": "200ms"}
        self.argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
        self.env = {**os.environ, "RELAY_ID": self.pipeline_id, "RELAY_TOPIC": self.topic,
                    "RELAY_OUTPUT": self.output, "COUNT_ID": unique_name("count"),
                    "RELAY_EXCLUSIVE": "1" if exclusive else "0",
                    "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                   os.environ.get("PYTHONPATH", "")])}
        self.redis_url, self.prefix = f"redis://{redis.address}/0", unique_name("p")
        self.count_group = unique_name("gc")
        self.count_argv = harness.worker_command(harness.packaged_config("demo.conf"), {
            **settings, "onceflow.pipeline": "relay_pipeline:counts",
            "onceflow.kafka.group-id": self.count_group,
            "onceflow.stores.redis.url": self.redis_url,
            "onceflow.stores.redis.key-prefix": self.prefix})
        create_topic(self.bootstrap, self.topic, PARTITIONS)
        create_topic(self.bootstrap, self.output, PARTITIONS)
        self.old_ends = produce(self.bootstrap, self.topic, items("old", 0, 120))
        assert set(self.old_ends) == set(range(PARTITIONS))

    def worker(self, name: str) -> harness.WorkerProcess:
        worker = harness.WorkerProcess(self.argv, self.env, self.tmp_path, name)
        worker.start()
        return worker

    def drain(self, name: str, ends: dict[int, int]) -> Path:
        worker = self.worker(name)
        try:
            assert caught_up(self.bootstrap, self.group, self.topic, ends, 90, worker), \
                worker.log_tail()
            assert worker.terminate(20) == 0, worker.log_tail()
        finally:
            if worker.exited() is None:
                worker.kill()
        return worker.logs[-1]

    def counted(self, name: str) -> dict[str, dict[str, int]]:
        """Run the downstream aggregate over everything republished; its states."""
        ends: dict[int, int] = {}
        for record in asyncio.run(harness.read_all(self.bootstrap, self.output, PARTITIONS,
                                                   quiet=1.0)):
            ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
        worker = harness.WorkerProcess(self.count_argv, self.env, self.tmp_path, name)
        worker.start()
        try:
            assert caught_up(self.bootstrap, self.count_group, self.output, ends, 90,
                             worker), worker.log_tail()
            assert worker.terminate(20) == 0, worker.log_tail()
        finally:
            if worker.exited() is None:
                worker.kill()
        store = RedisStore(self.redis_url, self.prefix, self.env["COUNT_ID"])
        try:
            return stored_states(store, "seen")
        finally:
            store.close()

    def forget(self) -> None:
        argv = self.argv
        forget = [*argv[:argv.index("run")], "forget", *argv[argv.index("run") + 1:]]
        forgot = subprocess.run([*forget, "--topic", self.topic], capture_output=True,
                                text=True, env=self.env, timeout=120)
        assert forgot.returncode == 0, forgot.stderr[-3000:]
        assert (f"forget {self.topic}: pipeline {self.pipeline_id!r}, log marks topic"
                in forgot.stderr)
        assert f"forget {self.topic}: This pipeline republishes to {self.output}" \
            in forgot.stderr
        summary = json.loads(forgot.stdout)
        assert summary["partitions"] == [0, 1], summary
        assert summary["rows"] == {"kafka/__logs__": 4}, summary  # marks, generations

    def counted_once_each(self, new_count: int) -> None:
        """After the forget: every new record republished once, and counted once."""
        written = generations(self.bootstrap, self.output)
        assert written["old"] == set(range(120))
        assert written["new"] == set(range(new_count))  # every new one republished
        assert self.counted("count_new") == {  # and each counted downstream once
            str(i): {**({"old": 1} if i < 120 else {}),
                     **({"new": 1} if i < new_count else {})}
            for i in range(max(120, new_count))}


@pytest.mark.parametrize(("new_count", "exclusive"), [(80, True), (300, False)],
                         ids=["shorter_exclusive", "grown_past"])
def test_a_storeless_republisher_refuses_a_recreated_topic_until_forgotten(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str], new_count: int, exclusive: bool,
) -> None:
    """Whether the new log ends below the marks or already holds other records at their
    offsets: exit 1 naming the topic, partition and offsets, nothing of it republished
    or committed; after ``forget`` every new record is republished, and the aggregate
    downstream (never forgotten) counts each once. An exclusive relay's resume reads its
    old outputs (at the old log's offsets) as older than the new log's: it skips none
    of the new records."""
    relay = Relay(kafka_service, redis_service, tmp_path, unique_name, exclusive)
    bootstrap, topic, old_ends = relay.bootstrap, relay.topic, relay.old_ends
    first = relay.drain("old", old_ends).read_text(errors="replace")
    assert "stores: none (" in first and f"{relay.pipeline_id}-log-marks" in first
    assert relay.counted("count_old") == {str(i): {"old": 1} for i in range(120)}

    asyncio.run(_recreate(bootstrap, topic, PARTITIONS))
    new_ends = produce(bootstrap, topic, items("new", 0, new_count))
    shorter = new_count < 120
    if shorter:  # each partition's new log ends below its mark
        assert all(new_ends[p] < old_ends[p] - 1 for p in range(PARTITIONS))
    else:  # it already holds other records at the marks' offsets
        assert all(new_ends[p] > old_ends[p] for p in range(PARTITIONS))

    log = tmp_path / "refused.log"
    with log.open("wb") as out:
        refused = subprocess.Popen(relay.argv, env=relay.env, stdout=out,
                                   stderr=subprocess.STDOUT)
    text = _stopped_with_1(refused, log, 60)
    found = REFUSED.search(text)
    assert found is not None, text[-3000:]
    assert found[1] == topic
    partition, held = int(found[2]), int(found[3])
    assert held == old_ends[partition] - 1
    if shorter:
        assert found[5] is not None and int(found[5]) == new_ends[partition]
    else:
        assert "differs" in found[4]
    assert f"onceflow forget --topic {topic}" in text
    assert f"This pipeline republishes to {relay.output}: after the forget" in text
    assert committed(bootstrap, relay.group, topic, PARTITIONS) == {0: 0, 1: 0}
    assert "new" not in generations(bootstrap, relay.output)  # nothing of it republished

    relay.forget()
    relay.drain("new", new_ends)
    relay.counted_once_each(new_count)


def test_a_republisher_running_when_its_topic_is_recreated_sends_nothing_of_the_new_log(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """The relay holds its partitions, caught up, when the topic is deleted and re-created
    and its new log grows past the old offsets: no assignment happens, and the broker
    serves the new log from the old position. Those records used to be republished
    before the snapshot's check stopped the worker, and again after the forget, in the
    log's next generation: the aggregate downstream counted them twice. A batch's outputs
    now wait for a check of its logs begun after it (``checkpoint.log_watch``): the relay
    stops (exit 1) with nothing of the new log sent, and after the forget each new record
    is republished and counted once."""
    relay = Relay(kafka_service, redis_service, tmp_path, unique_name, exclusive=False)
    bootstrap, topic, old_ends = relay.bootstrap, relay.topic, relay.old_ends
    worker = relay.worker("running")
    try:
        assert caught_up(bootstrap, relay.group, topic, old_ends, 90, worker), \
            worker.log_tail()
        asyncio.run(_recreate(bootstrap, topic, PARTITIONS))
        new_ends = produce(bootstrap, topic, items("new", 0, 300))
        assert all(new_ends[p] > old_ends[p] for p in range(PARTITIONS))  # grown past
        assert worker.wait(60) == 1, worker.log_tail()
    finally:
        if worker.exited() is None:
            worker.kill()
    text = worker.logs[-1].read_text(errors="replace")
    found = REFUSED.search(text)
    assert found is not None, text[-3000:]
    assert found[1] == topic and "differs" in found[4]
    assert "new" not in generations(bootstrap, relay.output)  # nothing of it republished
    assert committed(bootstrap, relay.group, topic, PARTITIONS) == {0: 0, 1: 0}

    relay.forget()
    relay.drain("new", new_ends)
    relay.counted_once_each(300)


def generations(bootstrap: str, topic: str) -> dict[str, set[int]]:
    """The ids republished to ``topic``, per generation (each output once: no crash)."""
    found: dict[str, list[int]] = {}
    for record in asyncio.run(harness.read_all(bootstrap, topic, PARTITIONS, quiet=1.0)):
        value = json.loads(record.value)
        assert value["relayed"] is True
        found.setdefault(value["gen"], []).append(value["id"])
    assert all(len(ids) == len(set(ids)) for ids in found.values()), found
    return {generation: set(ids) for generation, ids in found.items()}
