"""A producer-sequence table in the store that is no onceflow row stops the worker, naming
the stage, the key and the row, with no restart loop (issue 29, "A poisoned record never
loops": a stored state that cannot be decoded stops the worker). Before, the table failed
to decode inside each batch and the supervisor restarted the pipeline again and again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from helpers import committed, create_topic, exit_code_within, produce, start_worker

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.stages.producer_dedup import SEQUENCE_STAGE
from onceflow.stores.redis_store import RedisStore

STOPPED = 90.0  # s: a join (session timeout), the first batch, the escalation grace


def test_an_undecodable_producer_sequence_table_stops_the_worker_naming_its_row(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap, redis_url = kafka_service.address, f"redis://{redis_service.address}/0"
    topic, group, prefix = unique_name("robots"), unique_name("g"), unique_name("p")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, generate(50, seed=7).messages)
    store = RedisStore(redis_url, prefix, "robots")  # the demo pipeline's id and store
    row = store.row_name(SEQUENCE_STAGE, f"{topic}|0")
    store.close()
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(row.removeprefix("redis key ").strip("'"), b'{"next": "soon"}')
    finally:
        client.close()
    log = tmp_path / "worker.log"
    worker = start_worker(bootstrap, redis_url, group, prefix, topic, log,
                          ["--set", "onceflow.supervision.escalation-grace=1s"])
    code = exit_code_within(worker, STOPPED, log, "still running")
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert (f"the stored state of stage '{SEQUENCE_STAGE}', key '{topic}|0' cannot be decoded "
            "(not a onceflow producer sequence table: TypeError: ") in text, text[-3000:]
    assert f"its row: {row}; repair or delete that row" in text, text[-3000:]
    assert "a restart cannot fix this: escalating" in text and "restarting" not in text
    assert committed(bootstrap, group, topic, 1) == {0: 0}
