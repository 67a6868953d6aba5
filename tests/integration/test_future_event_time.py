"""One far-future event time on the real broker and Redis (issue 29): a device with a
clock ten years ahead. Its value used to become its partition's watermark and make every
later value late; it is dead-lettered with how far ahead it was, and the later values
are folded into their windows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from helpers import consume_all, create_topic, produce, stored_states, wait_for_log

from onceflow.devtools import harness
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.redis_store import RedisStore

PIPELINE = '''
import os
from onceflow import Pipeline
from onceflow.stages.windows import Tumbling

pipeline = (
    Pipeline("clocks", topics=(os.environ["CLOCKS_TOPIC"],), format="json")
    .aggregate("per_minute", key=lambda r: r["d"], init=lambda: 0, fold=lambda n, _: n + 1,
               window=Tumbling(60_000, event_time_ms=lambda r: r["t"]))
)
'''
MINUTE = 60_000
YEAR = 365 * 86_400_000


def test_a_far_future_event_time_is_dead_lettered_and_later_values_fold(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    topic, group, prefix = unique_name("clocks"), unique_name("g"), unique_name("p")
    dead, late = unique_name("dlq"), unique_name("late")
    redis_url = f"redis://{redis_service.address}/0"
    for name in (topic, dead, late):
        create_topic(kafka_service.address, name, 1)
    (tmp_path / "clocks_pipeline.py").write_text(textwrap.dedent(PIPELINE))
    base = int(time.time() * 1000) - 10 * MINUTE  # the broker's CreateTime is about now
    times = [base, base + 1000, base + 2000, base + 10 * YEAR,
             *(base + MINUTE + i * 1000 for i in range(5))]
    messages = [(b"dev", json.dumps({"d": "dev", "t": t}).encode()) for t in times]
    produce(kafka_service.address, topic, messages)
    settings = {**redis_settings(kafka_service.address, redis_url, group, prefix),
                "onceflow.pipeline": "clocks_pipeline:pipeline",
                "onceflow.kafka.dead-letter-topic": dead,
                "onceflow.kafka.late-events-topic": late,
                "onceflow.metrics.stats-interval": "200ms"}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    env = {**os.environ, "CLOCKS_TOPIC": topic,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_log(worker, log, f"'records': {len(messages)}", timeout=90)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    (letter,) = consume_all(kafka_service.address, dead, expected=1, timeout=15)
    reason = dict(letter.headers)["onceflow.reason"].decode()
    assert letter.value == messages[3][1]
    assert "'per_minute'" in reason and "is 3650d (" in reason and "max-future 1h" in reason
    store = RedisStore(redis_url, prefix, "clocks")
    try:
        (state,) = stored_states(store, "per_minute").values()
        windows = {start: json.loads(value) for _, start, value in
                   store.scan_history("per_minute")}
    finally:
        store.close()
    windows.update({int(start): n for start, n in state["open"].items()})
    folded = Counter(t - t % MINUTE for i, t in enumerate(times) if i != 3)
    assert windows == dict(folded)  # nothing late: the watermark never saw it
    assert "per_minute.late" not in log.read_text()
    assert consume_all(kafka_service.address, late, expected=1, timeout=3) == []
