"""A named side-output topic the broker does not have stops the worker at start.

Issue 29, "Start-up is all or nothing": a configured dead-letter topic that
does not exist used to go unseen until the first dead letter (a broker that
creates topics on first use made a new one nobody reads; one that does not
held every commit behind it). Now the worker exits 2 with one line naming
the key, the topic and the broker, before any actor starts or the group is
joined. The checks themselves are tried on the real broker too: an existing
topic passes, the late-events topic is checked only for a pipeline with
windows, a default name is left to the broker, and an unreachable broker
is only logged (the start retries it, as before).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from helpers import committed, create_topic, exit_code_within, produce, start_worker

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo, free_port
from onceflow.runtime.config import ConfigError, load_settings
from onceflow.runtime.preflight import check_side_topics
from onceflow.stages import Pipeline, Tumbling

BOUND = 20.0  # s from start to exit: loading the worker's modules takes about a second


def group_exists(bootstrap: str, group: str) -> bool:
    async def read() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return any(g[0] == group for g in await admin.list_consumer_groups())
        finally:
            await admin.close()

    return asyncio.run(read())


def test_a_missing_dead_letter_topic_exits_2_naming_it_before_the_group_is_joined(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    bootstrap = kafka_service.address
    topic, group, missing = unique_name("robots"), unique_name("g"), unique_name("dlq")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, generate(50, seed=3).messages)
    log = tmp_path / "worker.log"
    started = time.monotonic()
    worker = start_worker(bootstrap, f"redis://{redis_service.address}/0", group,
                          unique_name("p"), topic, log,
                          ["--set", f'onceflow.kafka.dead-letter-topic="{missing}"'])
    code = exit_code_within(worker, BOUND, log, "still running after start")
    text = log.read_text(errors="replace")
    assert code == 2, text[-3000:]
    assert time.monotonic() - started < BOUND
    lines = [line for line in text.splitlines() if "onceflow.kafka.dead-letter-topic" in line]
    assert len(lines) == 1 and lines[0].startswith("onceflow: config error: "), text[-3000:]
    assert lines[0].endswith(f": onceflow.kafka.dead-letter-topic: expected an existing topic, "
                             f"{missing!r} does not exist on {bootstrap}"), lines
    for trace in ("worker started", "(Re-)joining group", "Traceback", "child core"):
        assert trace not in text, text[-3000:]
    assert not group_exists(bootstrap, group)
    assert committed(bootstrap, group, topic, 1) == {0: 0}


def settings_for(tmp_path: Path, bootstrap: str, **topics: str):  # type: ignore[no-untyped-def]
    conf = tmp_path / "app.conf"
    named = "".join(f'    {key} = "{value}"\n' for key, value in topics.items())
    conf.write_text('onceflow {\n  pipeline = "unused:pipeline"\n'
                    f'  kafka {{\n    bootstrap-servers = "{bootstrap}"\n'
                    f'    group-id = "g"\n    request-timeout = 5s\n{named}  }}\n}}\n')
    return load_settings(conf)


PLAIN = Pipeline("plain", topics=("in",)).aggregate("n", key=str, init=int,
                                                     fold=lambda n, _: n + 1)
WINDOWED = Pipeline("windowed", topics=("in",)).aggregate(
    "n", key=str, init=int, fold=lambda n, _: n + 1,
    window=Tumbling(60_000, event_time_ms=lambda _: 0))


def test_the_check_on_the_real_broker(kafka_service: ServiceInfo, tmp_path: Path,
                                      unique_name: Callable[..., str],
                                      caplog: pytest.LogCaptureFixture) -> None:
    bootstrap = kafka_service.address
    dead, late, missing = unique_name("dlq"), unique_name("late"), unique_name("none")
    create_topic(bootstrap, dead, 1)
    create_topic(bootstrap, late, 1)
    ok = settings_for(tmp_path, bootstrap, **{"dead-letter-topic": dead,
                                              "late-events-topic": late})
    check_side_topics(ok, WINDOWED)
    no_late = settings_for(tmp_path, bootstrap, **{"dead-letter-topic": dead,
                                                   "late-events-topic": missing})
    check_side_topics(no_late, PLAIN)  # no windows: no late events written
    with pytest.raises(ConfigError) as refused:
        check_side_topics(no_late, WINDOWED)
    assert refused.value.key == "onceflow.kafka.late-events-topic"
    assert refused.value.expected == (f"expected an existing topic, {missing!r} does not "
                                      f"exist on {bootstrap}")
    check_side_topics(settings_for(tmp_path, bootstrap), WINDOWED)  # defaults: the broker's
    down = settings_for(tmp_path, f"127.0.0.1:{free_port()}", **{"dead-letter-topic": missing})
    with caplog.at_level(logging.WARNING, "onceflow.runtime.preflight"):
        check_side_topics(down, PLAIN)  # unreachable: logged, the start goes on
    assert f"starting without checking the topics {missing!r}" in caplog.text
