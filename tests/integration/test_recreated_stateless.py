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
    bootstrap = kafka_service.address
    topic, output, group = unique_name("relay_in"), unique_name("relay_out"), unique_name("g")
    pipeline_id = unique_name("relay")
    (tmp_path / "relay_pipeline.py").write_text(textwrap.dedent(PIPELINE))
    nowhere = closed_port()
    settings = {"onceflow.pipeline": "relay_pipeline:pipeline",
                "onceflow.kafka.bootstrap-servers": bootstrap,
                "onceflow.kafka.group-id": group,
                "onceflow.stores.redis.url": f"redis://127.0.0.1:{nowhere}/0",
                "onceflow.stores.cassandra.contact-points": "127.0.0.1",
                "onceflow.stores.cassandra.port": str(nowhere),
                "onceflow.commit.interval": "200ms"}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    env = {**os.environ, "RELAY_ID": pipeline_id, "RELAY_TOPIC": topic, "RELAY_OUTPUT": output,
           "COUNT_ID": unique_name("count"), "RELAY_EXCLUSIVE": "1" if exclusive else "0",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    create_topic(bootstrap, topic, PARTITIONS)
    create_topic(bootstrap, output, PARTITIONS)
    old_ends = produce(bootstrap, topic, items("old", 0, 120))
    assert set(old_ends) == set(range(PARTITIONS))

    def drain(name: str, ends: dict[int, int]) -> Path:
        worker = harness.WorkerProcess(argv, env, tmp_path, name)
        worker.start()
        try:
            assert caught_up(bootstrap, group, topic, ends, 90, worker), worker.log_tail()
            assert worker.terminate(20) == 0, worker.log_tail()
        finally:
            if worker.exited() is None:
                worker.kill()
        return worker.logs[-1]

    first = drain("old", old_ends).read_text(errors="replace")
    assert "stores: none (" in first and f"{pipeline_id}-log-marks" in first
    redis_url, prefix = f"redis://{redis_service.address}/0", unique_name("p")
    count_group = unique_name("gc")
    count_argv = harness.worker_command(harness.packaged_config("demo.conf"), {
        **settings, "onceflow.pipeline": "relay_pipeline:counts",
        "onceflow.kafka.group-id": count_group, "onceflow.stores.redis.url": redis_url,
        "onceflow.stores.redis.key-prefix": prefix})

    def counted(name: str) -> dict[str, dict[str, int]]:
        """Run the downstream aggregate over everything republished; its states."""
        ends: dict[int, int] = {}
        for record in asyncio.run(harness.read_all(bootstrap, output, PARTITIONS, quiet=1.0)):
            ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
        worker = harness.WorkerProcess(count_argv, env, tmp_path, name)
        worker.start()
        try:
            assert caught_up(bootstrap, count_group, output, ends, 90, worker), \
                worker.log_tail()
            assert worker.terminate(20) == 0, worker.log_tail()
        finally:
            if worker.exited() is None:
                worker.kill()
        store = RedisStore(redis_url, prefix, env["COUNT_ID"])
        try:
            return stored_states(store, "seen")
        finally:
            store.close()

    assert counted("count_old") == {str(i): {"old": 1} for i in range(120)}

    asyncio.run(_recreate(bootstrap, topic, PARTITIONS))
    new_ends = produce(bootstrap, topic, items("new", 0, new_count))
    shorter = new_count < 120
    if shorter:  # each partition's new log ends below its mark
        assert all(new_ends[p] < old_ends[p] - 1 for p in range(PARTITIONS))
    else:  # it already holds other records at the marks' offsets
        assert all(new_ends[p] > old_ends[p] for p in range(PARTITIONS))

    log = tmp_path / "refused.log"
    with log.open("wb") as out:
        refused = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
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
    assert f"This pipeline republishes to {output}: after the forget" in text
    assert committed(bootstrap, group, topic, PARTITIONS) == {0: 0, 1: 0}  # nothing committed
    assert "new" not in generations(bootstrap, output)  # nothing of the new log republished

    forget = [*argv[:argv.index("run")], "forget", *argv[argv.index("run") + 1:]]
    forgot = subprocess.run([*forget, "--topic", topic], capture_output=True, text=True,
                            env=env, timeout=120)
    assert forgot.returncode == 0, forgot.stderr[-3000:]
    assert f"forget {topic}: pipeline {pipeline_id!r}, log marks topic" in forgot.stderr
    assert f"forget {topic}: This pipeline republishes to {output}" in forgot.stderr
    summary = json.loads(forgot.stdout)
    assert summary["partitions"] == [0, 1], summary
    assert summary["rows"] == {"kafka/__logs__": 4}, summary  # marks, generations

    drain("new", new_ends)
    written = generations(bootstrap, output)
    assert written["old"] == set(range(120))
    assert written["new"] == set(range(new_count))  # every new one republished
    assert counted("count_new") == {  # and each counted downstream once
        str(i): {**({"old": 1} if i < 120 else {}), **({"new": 1} if i < new_count else {})}
        for i in range(max(120, new_count))}


def generations(bootstrap: str, topic: str) -> dict[str, set[int]]:
    """The ids republished to ``topic``, per generation (each output once: no crash)."""
    found: dict[str, list[int]] = {}
    for record in asyncio.run(harness.read_all(bootstrap, topic, PARTITIONS, quiet=1.0)):
        value = json.loads(record.value)
        assert value["relayed"] is True
        found.setdefault(value["gen"], []).append(value["id"])
    assert all(len(ids) == len(set(ids)) for ids in found.values()), found
    return {generation: set(ids) for generation, ids in found.items()}
