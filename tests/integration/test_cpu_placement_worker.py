"""A real worker keeps every thread on the CPU ``onceflow.cpu`` names, those it starts later
(Kafka, pipeline, persistence) included, while it consumes from a real broker into Redis;
an unknown CPU stops it at start naming the key."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import exit_code_within, produce, start_worker, wait_for_log

from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo
from onceflow.runtime import cpu_placement

pytestmark = pytest.mark.skipif(
    not cpu_placement.supported() or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs Linux and two CPUs")


def thread_cpus(pid: int) -> dict[str, str]:
    """Each thread's name and the CPUs it may run on (``Cpus_allowed_list``)."""
    cpus = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = dict(line.split(":\t", 1) for line in
                      (task / "status").read_text().splitlines() if ":\t" in line)
        cpus[f"{status['Name'].strip()}-{task.name}"] = status["Cpus_allowed_list"].strip()
    return cpus


def test_every_thread_of_a_consuming_worker_stays_on_the_named_cpu(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    cpu = max(os.sched_getaffinity(0))
    topic = unique_name("robots")
    produce(kafka_service.address, topic, generate(2000, seed=5).messages)
    log = tmp_path / "worker.log"
    worker = start_worker(kafka_service.address, f"redis://{redis_service.address}/0",
                          unique_name("g"), unique_name("p"), topic, log,
                          ["--set", f"onceflow.cpu={cpu}"])
    try:
        wait_for_log(worker, log, "partitions assigned: [(", 60)
        wait_for_log(worker, log, "folded", 60)  # the periodic stats: records went through
        cpus = thread_cpus(worker.pid)
        assert len(cpus) >= 5, cpus  # main, Kafka loop, pipeline, persistence, ...
        assert set(cpus.values()) == {str(cpu)}, cpus
        assert f"threads kept on CPU {cpu} (as onceflow.cpu says)" in log.read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        exit_code_within(worker, 60, log, "no exit after SIGTERM")


def test_a_cpu_the_process_may_not_use_stops_the_worker_at_start(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    log = tmp_path / "worker.log"
    worker = start_worker(kafka_service.address, f"redis://{redis_service.address}/0",
                          unique_name("g"), unique_name("p"), unique_name("robots"), log,
                          ["--set", "onceflow.cpu=4096"])
    assert exit_code_within(worker, 30, log, "still running after start") == 2
    text = log.read_text(errors="replace")
    assert "onceflow.cpu: expected auto, off or one of this process's CPUs" in text, text[-2000:]
    assert "worker started" not in text
