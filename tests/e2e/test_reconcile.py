"""``onceflow reconcile`` proves a pipeline's stores after SIGKILLs, and finds what was broken.

The chaos topology (a republisher and a windowed aggregator, both SIGKILLed and
restarted while the robots' reports flow) runs to its end; then ``onceflow
reconcile`` runs as a subprocess against the aggregator's configuration: it
replays the normalized topic up to the group's committed offsets and must find
every state and history row equal (exit 0), with every event folded or late.
Then the test breaks three rows by hand: +1 on a count in a daily state, +1 in a
closed minute window (a history row), a minute state deleted; reconcile must exit
1 naming exactly those three.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from helpers import run_reconcile

from onceflow.devtools import harness
from onceflow.devtools.chaos import ChaosOptions, ChaosReport, run_chaos
from onceflow.devtools.services import ServiceInfo
from onceflow.examples.robot_chain import DAY_STAGE, MINUTE_STAGE
from onceflow.stages.state import AggregateState, decode_state, encode_state
from onceflow.stores.redis_store import RedisStore

PIPELINE = "robots-windows"


def reconcile(report: ChaosReport, bootstrap: str, settings: dict[str, str], out: Path
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Reconcile the chaos run's aggregator (its normalized topic against its stores)."""
    overrides = {**settings, "onceflow.pipeline": "onceflow.examples.robot_chain:windows",
                 "onceflow.kafka.bootstrap-servers": bootstrap,
                 "onceflow.kafka.group-id": report.groups["aggregator"],
                 "onceflow.kafka.dead-letter-topic": report.topics["dead"],
                 "onceflow.kafka.late-events-topic": report.topics["late"]}
    env = {**os.environ, "ONCEFLOW_CHAIN_RAW_TOPIC": report.topics["raw"],
           "ONCEFLOW_CHAIN_NORMALIZED_TOPIC": report.topics["normalized"],
           "ONCEFLOW_ROBOTS_STORE": "redis"}
    return run_reconcile(overrides, env, out)


def test_reconcile_after_sigkills_then_three_broken_rows(
        kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(1_000_000)
    url, prefix = f"redis://{redis_service.address}/0", f"reconcile-{time.time_ns()}"
    settings = {"onceflow.stores.redis.url": url, "onceflow.stores.redis.key-prefix": prefix}
    report = run_chaos(ChaosOptions(messages=6_000, duration=10.0, kills=4, seed=seed),
                       bootstrap=kafka_service.address, store_settings=settings,
                       workdir=tmp_path)
    context = f"seed={seed}, logs in {tmp_path}: {report}"
    assert report.exact, context  # the chaos run's own ground truth agrees
    assert sum(report.kills.values()) >= 4, context

    done, found = reconcile(report, kafka_service.address, settings, tmp_path / "clean")
    context += f"\nreconcile: {done.stdout}\n{done.stderr}"
    assert done.returncode == 0, context
    assert found["entries"] == [], context
    stages = found["stages"]
    assert set(stages) == {MINUTE_STAGE, DAY_STAGE}, context
    assert all(set(counts) == {"equal"} for counts in stages.values()), context
    assert stages[MINUTE_STAGE]["equal"] > 1000, context  # states and closed minute windows
    assert "every row reconciles" in done.stdout, context
    counted = found["accounting"]
    # Every event accounted for: folded into the minute stage, or late there.
    late = counted.get(f"{MINUTE_STAGE}.late", 0)
    assert counted[f"{MINUTE_STAGE}.folded"] + late == report.events, context
    assert late == report.late[MINUTE_STAGE], context  # as the late-events topic says
    day_late = counted.get(f"{DAY_STAGE}.late", 0)
    assert counted[f"{DAY_STAGE}.folded"] + day_late == report.events - late, context
    assert day_late == report.late[DAY_STAGE], context
    assert found["produced"].get(report.topics["late"], 0) == late + day_late, context
    assert found["records_read"] == report.normalized, context
    assert {row["first_retained"] for row in found["offsets"]} == {0}, context  # all retained

    store = RedisStore(url, prefix, PIPELINE)
    raw = redis.Redis.from_url(url)
    try:
        day_key, data = next((k, d) for k, d in store.scan(DAY_STAGE)
                             if decode_state(d).value["open"])
        state = decode_state(data)
        start = next(iter(state.value["open"]))
        counts = state.value["open"][start]
        bumped = {**state.value, "open": {**state.value["open"],
                                          start: {**counts, "ok": counts["ok"] + 1}}}
        store.save(DAY_STAGE, {day_key: encode_state(AggregateState(
            bumped, state.watermarks, state.home))})
        minute_key, window, value = next(iter(store.scan_history(MINUTE_STAGE)))
        closed = json.loads(value)
        closed["failed"] += 1
        store.save_history(MINUTE_STAGE, {(minute_key, window): json.dumps(closed).encode()})
        gone = next(k for k, _ in store.scan(MINUTE_STAGE) if k != minute_key)
        assert raw.delete(f"{prefix}:{PIPELINE}:s:{MINUTE_STAGE}:{gone}") == 1
    finally:
        store.close()
        raw.close()

    done, found = reconcile(report, kafka_service.address, settings, tmp_path / "broken")
    context += f"\nreconcile after the damage: {done.stdout}\n{done.stderr}"
    assert done.returncode == 1, context
    named = {(e["stage"], e["key"], e["window"], e["verdict"]) for e in found["entries"]}
    assert named == {(DAY_STAGE, day_key, None, "drifted"),
                     (MINUTE_STAGE, minute_key, window, "drifted"),
                     (MINUTE_STAGE, gone, None, "missing")}, context
    assert len(found["entries"]) == 3, context
    drifted = next(e for e in found["entries"] if e["window"] == window)
    assert drifted["stored"]["failed"] == drifted["recomputed"]["failed"] + 1, context
    assert "DRIFT" in done.stdout and gone in done.stdout, context
    assert (tmp_path / "broken" / "reconcile.html").read_text().count("drifted") >= 2


def test_reconcile_reads_a_repartition_hop_from_its_topic_after_sigkills(
        kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
        unique_name: Callable[..., str]) -> None:
    """Orders re-keyed by customer through a repartition topic, two workers SIGKILLed:
    the per-customer totals reconcile, each order folded once, the hop read back."""
    from test_repartition import Group, orders, truth

    g = Group(kafka_service, redis_service, tmp_path, unique_name,
              "onceflow.examples.orders:build")
    g.start()
    records = orders(4_000, customers=120, seed=random.SystemRandom().randrange(10**6))
    rng = random.Random()

    async def produce_while_killing() -> dict[int, int]:
        producing = asyncio.create_task(harness.produce(g.bootstrap, g.topic, records, 8))
        for victim in [*g.workers, *g.workers]:
            await victim.assigned()
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            victim.kill()
            victim.start()
        return await producing

    ends = asyncio.run(produce_while_killing())
    g.drained(g.topic, ends)
    hop_ends = asyncio.run(harness.read_ends(g.bootstrap, g.hop, 4))
    g.drained(g.hop, hop_ends)
    assert g.stop() == [0, 0]
    settings = {"onceflow.pipeline": "onceflow.examples.orders:build",
                "onceflow.pipeline-settings.topic": g.topic,
                "onceflow.pipeline-settings.repartition-topic": g.hop,
                "onceflow.kafka.bootstrap-servers": g.bootstrap,
                "onceflow.kafka.group-id": g.group, "onceflow.kafka.dead-letter-topic": g.dead,
                "onceflow.stores.redis.url": g.redis_url,
                "onceflow.stores.redis.key-prefix": g.prefix}
    done, found = run_reconcile(settings, dict(os.environ), tmp_path / "report")
    context = f"logs {g.logs()}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, context
    assert found["stages"] == {"per_customer": {"equal": len(truth(records))}}, context
    assert found["accounting"]["per_customer.folded"] == len(records), context
    assert found["records_read"] == sum(ends.values()) + sum(hop_ends.values()), context
    assert found["produced"][g.hop] == sum(ends.values()), context  # the replay's own hop
