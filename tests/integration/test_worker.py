"""The worker process on a real broker and Redis: SIGTERM drain, dead letters."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from helpers import (
    committed,
    consume_all,
    create_topic,
    expected_counts,
    produce,
    start_worker,
    stored_states,
    wait_for_log,
)

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

NEVER = ["--set", "onceflow.persistence.interval=1h", "--set", "onceflow.commit.interval=1h"]
FAST_STATS = ["--set", "onceflow.metrics.stats-interval=200ms"]


def robot_totals(redis_url: str, prefix: str) -> dict[str, dict[str, int]]:
    store = RedisStore(redis_url, prefix, "robots")
    try:
        return stored_states(store, "per_robot")
    finally:
        store.close()


def test_sigterm_flushes_commits_and_exits_zero_within_10s(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, 4)
    stream = generate(5_000, seed=3)
    ends = produce(kafka_service.address, topic, stream.messages)
    log = tmp_path / "worker.log"
    # Ticks would persist and commit only after an hour: what is durable
    # after SIGTERM was made durable by the shutdown drain.
    worker = start_worker(kafka_service.address, redis_url, group, prefix, topic, log,
                          [*NEVER, *FAST_STATS])
    try:
        wait_for_log(worker, log, "'records': 5000", timeout=60)
        assert robot_totals(redis_url, prefix) == {}
        assert sum(committed(kafka_service.address, group, topic, 4).values()) == 0
        stopping = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=10)
        took = time.monotonic() - stopping
    finally:
        if worker.poll() is None:
            worker.kill()
    assert code == 0, log.read_text()[-3000:]
    assert took < 10
    assert committed(kafka_service.address, group, topic, 4) == {p: ends.get(p, 0)
                                                                 for p in range(4)}
    assert robot_totals(redis_url, prefix) == expected_counts(stream.truth)


def test_undecodable_records_go_to_dead_letters_with_reason_and_nothing_is_lost(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    dead = unique_name("dlq")
    redis_url = f"redis://{redis_service.address}/0"
    create_topic(kafka_service.address, topic, 1)
    create_topic(kafka_service.address, dead, 1)
    good = generate(200, robots=10, seed=5).messages
    not_json = (b"robot-0001", b"\xff\xfe definitely not JSON")
    no_seq = (b"robot-0002", b'{"serial":"robot-0002","results":[{"ok":true,"ts":1}]}')
    messages = [*good[:100], not_json, *good[100:150], no_seq, *good[150:]]
    ends = produce(kafka_service.address, topic, messages)
    log = tmp_path / "worker.log"
    worker = start_worker(kafka_service.address, redis_url, group, prefix, topic, log,
                          ["--set", f'onceflow.kafka.dead-letter-topic="{dead}"', *FAST_STATS])
    try:
        wait_for_log(worker, log, "'records': 202", timeout=60)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=10) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    letters = consume_all(kafka_service.address, dead, expected=2)
    reasons = [dict(r.headers)["onceflow.reason"].decode() for r in letters]
    assert [r.value for r in letters] == [not_json[1], no_seq[1]]
    assert reasons[0].startswith(f"topic {topic!r} is declared json but the value does not "
                                 "parse: JSONDecodeError: "), reasons
    assert reasons[1] == "dedup: the sequence extractor raised KeyError: 'seq'", reasons
    assert dict(letters[0].headers)["onceflow.source"] == f"{topic}/0/100".encode()
    truth = generate(200, robots=10, seed=5).truth
    assert robot_totals(redis_url, prefix) == expected_counts(truth)
    assert committed(kafka_service.address, group, topic, 1) == {0: ends[0]}
