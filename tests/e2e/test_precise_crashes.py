"""Crashes at exact points (fault injection) and one key fed by every partition.

Each scenario runs real worker processes on the real broker and Redis, then
compares the stored aggregates with the ground truth from the input.
"""

from __future__ import annotations

import ast
import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from digest import log_digest, window_diff
from helpers import expected_counts, stored_states

from onceflow.devtools import harness
from onceflow.devtools.chaos import expected_windows, stored_windows
from onceflow.devtools.robot_stream import fastening_events, generate, parse_report
from onceflow.devtools.services import ServiceInfo
from onceflow.stages.state import decode_state
from onceflow.stores.redis_store import RedisStore


class Setup:
    """Topics, group names and a Redis namespace for one test, plus worker launching."""

    def __init__(self, kafka: ServiceInfo, redis: ServiceInfo, tmp_path: Path,
                 unique_name: Callable[..., str]):
        self.bootstrap = kafka.address
        self.redis_url = f"redis://{redis.address}/0"
        self.prefix = unique_name("p")
        self.tmp_path = tmp_path
        self.unique_name = unique_name
        self.env = {**os.environ, "ONCEFLOW_ROBOTS_STORE": "redis"}
        self.processes: list[harness.WorkerProcess] = []

    def worker(self, name: str, pipeline: str, group: str, faults: Mapping[str, str] = {},
               extra: Mapping[str, str] = {}) -> harness.WorkerProcess:
        settings = {**extra,
            "onceflow.pipeline": pipeline,
            "onceflow.kafka.bootstrap-servers": self.bootstrap,
            "onceflow.kafka.group-id": group,
            "onceflow.stores.redis.url": self.redis_url,
            "onceflow.stores.redis.key-prefix": self.prefix,
        }
        argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
        process = harness.WorkerProcess(argv, {**self.env, **faults}, self.tmp_path, name)
        process.start()
        self.processes.append(process)
        return process

    def digest(self) -> str:
        """The workers' logs in short, for a failed assertion (CI keeps no files)."""
        return log_digest(log for process in self.processes for log in process.logs)

    def store(self, pipeline_id: str) -> RedisStore:
        return RedisStore(self.redis_url, self.prefix, pipeline_id)


def wait_killed(worker: harness.WorkerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while worker.exited() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.exited() == -9, f"expected a SIGKILL; see {worker.logs[-1]}"


async def drained(bootstrap: str, group: str, topic: str, ends: Mapping[int, int],
                  worker: harness.WorkerProcess) -> None:
    async with harness.CommittedOffsets(bootstrap, group) as committed:
        assert await committed.wait_for(topic, ends, 120, worker), f"see {worker.logs[-1]}"



@pytest.mark.parametrize(
    "upstream_first", [False, True], ids=["downstream-first", "upstream-first"]
)
def test_crash_between_persisting_two_stages(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str], upstream_first: bool,
) -> None:
    s = Setup(kafka_service, redis_service, tmp_path, unique_name)
    topic, group = unique_name("events"), unique_name("g")
    s.env["ONCEFLOW_CHAIN_NORMALIZED_TOPIC"] = topic
    stream = generate(2_000, robots=50, seed=21)
    asyncio.run(harness.create_topic(s.bootstrap, topic, 2))
    ends = asyncio.run(harness.produce(s.bootstrap, topic, fastening_events(stream)))
    first = "per_robot_minute" if upstream_first else "per_robot_day"
    faults = {"ONCEFLOW_FAULT_KILL_AFTER_SAVE": first,
              "ONCEFLOW_FAULT_UPSTREAM_FIRST": "1" if upstream_first else ""}
    # The first flush writes one stage, then the process is SIGKILLed.
    wait_killed(s.worker("crashing", "onceflow.examples.robot_chain:windows", group, faults))
    worker = s.worker("aggregator", "onceflow.examples.robot_chain:windows", group)
    asyncio.run(drained(s.bootstrap, group, topic, ends, worker))
    assert worker.terminate(10) == 0
    truth, _ = expected_windows(stream)
    day, _ = stored_windows(s.store("robots-windows"), "per_robot_day")
    got, want = sum(day.values(), Counter()), sum(truth["per_robot_day"].values(), Counter())
    if upstream_first:
        # The minute stage kept watermarks the daily stage never saw: replays
        # stop at the minute stage and the daily totals lose them for good.
        assert sum(want.values()) - sum(got.values()) > 0
    else:
        assert day == truth["per_robot_day"]
        minute, _ = stored_windows(s.store("robots-windows"), "per_robot_minute")
        assert minute == truth["per_robot_minute"]


def test_republisher_killed_in_the_middle_of_one_inputs_fan_out(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    s = Setup(kafka_service, redis_service, tmp_path, unique_name)
    raw, normalized = unique_name("raw"), unique_name("norm")
    s.env |= {"ONCEFLOW_CHAIN_RAW_TOPIC": raw, "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": normalized}
    stream = generate(3_000, robots=100, seed=5)
    sizes = [len(parse_report(v)["results"]) for _, v in stream.messages]
    record = next(i for i, n in enumerate(sizes) if n >= 4 and i > 100)
    kill_after = sum(sizes[:record]) + 2  # two of this record's outputs are out, the rest not
    for topic in (raw, normalized):
        asyncio.run(harness.create_topic(s.bootstrap, topic, 1))
    raw_ends = asyncio.run(harness.produce(s.bootstrap, raw, stream.messages))
    rep_group, agg_group = unique_name("rep"), unique_name("agg")
    dying = s.worker("dying", "onceflow.examples.robot_chain:normalize_per_value", rep_group,
                     {"ONCEFLOW_FAULT_KILL_AFTER_SENDS": str(kill_after)})
    wait_killed(dying)
    partial = asyncio.run(harness.read_ends(s.bootstrap, normalized, 1))[0]
    assert partial >= kill_after  # the fan-out really was cut in the middle
    republisher = s.worker("republisher", "onceflow.examples.robot_chain:normalize_per_value",
                           rep_group)
    aggregator = s.worker("aggregator", "onceflow.examples.robot_chain:windows", agg_group)
    asyncio.run(drained(s.bootstrap, rep_group, raw, raw_ends, republisher))
    norm_ends = asyncio.run(harness.read_ends(s.bootstrap, normalized, 1))
    assert norm_ends[0] > stream.events  # the cut record's outputs (and more) were re-sent
    asyncio.run(drained(s.bootstrap, agg_group, normalized, norm_ends, aggregator))
    assert republisher.terminate(10) == 0 and aggregator.terminate(10) == 0
    truth, _ = expected_windows(stream)
    store = s.store("robots-windows")
    for stage in ("per_robot_minute", "per_robot_day"):
        found, overlaps = stored_windows(store, stage)
        exact = overlaps == 0 and found == truth[stage]
        assert exact, (f"{stage}: {overlaps} overlaps; {window_diff(found, truth[stage])}; "
                       f"ends {norm_ends}, partial {partial}\n{s.digest()}")
    assert store.read_stats()["per_robot_minute.duplicates"] >= norm_ends[0] - stream.events


def test_one_key_fed_by_every_partition_stays_exact_under_replay(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    s = Setup(kafka_service, redis_service, tmp_path, unique_name)
    topic, group = unique_name("robots"), unique_name("g")
    s.env["ONCEFLOW_ROBOTS_TOPIC"] = topic
    stream = generate(20_000, seed=random.SystemRandom().randrange(10**6))
    asyncio.run(harness.create_topic(s.bootstrap, topic, 4))
    # One worker owns every partition, so a key may draw from all of them.
    single = {"onceflow.single-worker": "true"}
    # The first one dies right after its first state write, before any commit: its
    # successor surely replays records already folded (random kills may not).
    crashing = s.worker("crashing", "onceflow.examples.robots:fleet", group,
                        {"ONCEFLOW_FAULT_KILL_AFTER_SAVE": "fleet"}, single)

    async def produce_while_killing() -> tuple[dict[int, int], harness.WorkerProcess]:
        producing = asyncio.create_task(harness.produce(s.bootstrap, topic, stream.messages, 12))
        while crashing.exited() is None:
            await asyncio.sleep(0.05)
        assert crashing.exited() == -9, f"expected a SIGKILL; see {crashing.logs[-1]}"
        # The replay is certain: states hold records above the committed offsets, and
        # the producer sequences (written after the states) do not, so the fold meets
        # them again. (Not judged by the stored `fleet.duplicates`: stats are added after
        # a snapshot's rows, so a kill between the two loses that count.)
        committed = await _committed(s.bootstrap, group, topic)
        folded = [(p, position[0]) for _, value in s.store("fleet").scan("fleet")
                  for (_, p), position in decode_state(value).watermarks.items()]
        assert any(offset >= committed[p] for p, offset in folded), (folded, committed)
        worker = s.worker("fleet", "onceflow.examples.robots:fleet", group, extra=single)
        rng = random.Random()
        for _ in range(3):
            await worker.assigned()
            await asyncio.sleep(rng.uniform(0.3, 2.0))
            worker.kill()
            worker.start()
        return await producing, worker

    ends, worker = asyncio.run(produce_while_killing())
    asyncio.run(drained(s.bootstrap, group, topic, ends, worker))
    asyncio.run(worker.assigned())
    assert worker.terminate(10) == 0
    store = s.store("fleet")
    states = {key: decode_state(value) for key, value in store.scan("fleet")}
    truth = sum(stream.truth.values(), Counter())
    assert {k: st.value for k, st in states.items()} == {"ok": truth["ok"],
                                                         "failed": truth["failed"]}
    assert all(len(st.watermarks) == 4 for st in states.values())  # fed by all 4 partitions


def test_an_aggregate_feeding_a_republish_is_killed_right_after_writing_its_state(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """The state is written only after the records it forwarded are acknowledged:
    the replay after the kill stops at the aggregate, and nothing is lost downstream."""
    s = Setup(kafka_service, redis_service, tmp_path, unique_name)
    raw, normalized = unique_name("raw"), unique_name("norm")
    s.env |= {"ONCEFLOW_CHAIN_RAW_TOPIC": raw, "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": normalized}
    stream = generate(20_000, robots=100, seed=8)
    for topic in (raw, normalized):
        asyncio.run(harness.create_topic(s.bootstrap, topic, 2))
    raw_ends = asyncio.run(harness.produce(s.bootstrap, raw, stream.messages))
    pipeline = "onceflow.examples.robot_chain:counting_normalize"
    rep_group, agg_group = unique_name("rep"), unique_name("agg")
    # Its first save (and the kill) comes 100 ms in, well before the 20,000 reports are
    # all republished (at demo.conf's 500 ms a fast republisher has sent them all).
    wait_killed(s.worker("dying", pipeline, rep_group,
                         {"ONCEFLOW_FAULT_KILL_AFTER_SAVE": "per_robot_seen"},
                         {"onceflow.persistence.interval": "100ms"}))
    killed_at = asyncio.run(harness.read_ends(s.bootstrap, normalized, 2))
    assert 0 < sum(killed_at.values()) < stream.events  # killed part-way, outputs out
    republisher = s.worker("republisher", pipeline, rep_group)
    aggregator = s.worker("aggregator", "onceflow.examples.robot_chain:windows", agg_group)
    asyncio.run(drained(s.bootstrap, rep_group, raw, raw_ends, republisher))
    norm_ends = asyncio.run(harness.read_ends(s.bootstrap, normalized, 2))
    asyncio.run(drained(s.bootstrap, agg_group, normalized, norm_ends, aggregator))
    assert republisher.terminate(10) == 0 and aggregator.terminate(10) == 0
    seen = stored_states(s.store("robots-counting-normalize"), "per_robot_seen")
    assert seen == expected_counts(stream.truth)
    truth, _ = expected_windows(stream)
    for stage in ("per_robot_minute", "per_robot_day"):
        found, overlaps = stored_windows(s.store("robots-windows"), stage)
        assert overlaps == 0 and found == truth[stage], stage


def test_a_worker_dies_with_records_in_the_outbox_and_its_successor_delivers_them(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    """Worker A cannot reach the output topic: its records go to the outbox, its
    states are written, none of its offsets is committed. A is SIGKILLed; worker
    B, running all along, takes A's partitions and, before fetching from them,
    A's outbox rows: every window downstream is exact."""
    s = Setup(kafka_service, redis_service, tmp_path, unique_name)
    raw, normalized = unique_name("raw"), unique_name("norm")
    s.env |= {"ONCEFLOW_CHAIN_RAW_TOPIC": raw, "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": normalized}
    stream = generate(6_000, robots=100, seed=13)
    for topic in (raw, normalized):
        asyncio.run(harness.create_topic(s.bootstrap, topic, 4))
    pipeline = "onceflow.examples.robot_chain:counting_normalize"
    group, agg_group = unique_name("rep"), unique_name("agg")
    cut_off = s.worker("cut-off", pipeline, group, {"ONCEFLOW_FAULT_PRODUCE_FAILS": normalized},
                       {"onceflow.kafka.producer.delivery-timeout": "1s"})
    asyncio.run(cut_off.assigned())
    survivor = s.worker("survivor", pipeline, group)
    asyncio.run(survivor.assigned())
    time.sleep(3)  # the group settles: two partitions each
    raw_ends = asyncio.run(harness.produce(s.bootstrap, raw, stream.messages))
    outbox = s.store("robots-counting-normalize")
    held, deadline = 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        previous, held = held, sum(map(len, outbox.outbox_load().values()))
        if held and held == previous:  # the cut-off worker has outboxed what it had
            break
        time.sleep(2)
    mine = _last_assignment(cut_off, raw)
    assert held > 0 and mine, f"nothing in the outbox; see {cut_off.logs[-1]}"
    offsets = asyncio.run(_committed(s.bootstrap, group, raw))
    assert all(offsets[p] == 0 for p in mine), (mine, offsets)  # nothing behind the outbox
    cut_off.kill()
    held = sum(map(len, outbox.outbox_load().values()))  # all it left behind
    asyncio.run(drained(s.bootstrap, group, raw, raw_ends, survivor))
    assert f"adopted {held} outbox records" in survivor.logs[-1].read_text()
    assert outbox.outbox_load() == {}
    aggregator = s.worker("aggregator", "onceflow.examples.robot_chain:windows", agg_group)
    norm_ends = asyncio.run(harness.read_ends(s.bootstrap, normalized, 4))
    asyncio.run(drained(s.bootstrap, agg_group, normalized, norm_ends, aggregator))
    assert survivor.terminate(10) == 0 and aggregator.terminate(10) == 0
    truth, _ = expected_windows(stream)
    for stage in ("per_robot_minute", "per_robot_day"):
        found, overlaps = stored_windows(s.store("robots-windows"), stage)
        assert overlaps == 0 and found == truth[stage], stage


def _last_assignment(worker: harness.WorkerProcess, topic: str) -> list[int]:
    """The partitions of ``topic`` in the worker's last "partitions assigned" log line."""
    lines = [line for line in worker.logs[-1].read_text().splitlines()
             if "partitions assigned:" in line]
    pairs = ast.literal_eval(lines[-1].split("partitions assigned:", 1)[1].strip())
    return [p for t, p in pairs if t == topic]


async def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    async with harness.CommittedOffsets(bootstrap, group) as offsets:
        return await offsets.read(topic, range(4))
