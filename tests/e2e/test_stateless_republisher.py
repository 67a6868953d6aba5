"""A stateless republisher with no Redis running anywhere, SIGKILLed at random points:
every window downstream exact (issue 32: a republisher needs no store).

The chaos run's robot chain (``onceflow.devtools.chaos``): the republisher
(raw reports -> a unit of fastening events per report, without the
``(serial, seq)`` table, so the robots re-send nothing) is pointed at a Redis
and a Cassandra where nothing listens, so it runs on Kafka alone; the windowed
aggregator downstream keeps its states in the session's Cassandra and drops
the republisher's replays by their source chain. Both are SIGKILLed at random
moments; the windows are compared with the truth recomputed from the input.
Before, ``outbox-store = auto`` gave the republisher a Redis outbox, which it
retried for minutes at its first assignment: nothing got through.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

from onceflow.devtools.chaos import ChaosOptions, run_chaos, store_settings
from onceflow.devtools.services import ServiceInfo


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens once the socket is closed


def test_a_republisher_without_any_store_killed_at_random_keeps_every_window_exact(
    kafka_service: ServiceInfo, cassandra_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    nowhere = closed_port()
    seed = random.SystemRandom().randrange(1_000_000)
    republisher = {
        "onceflow.kafka.producer.outbox-store": "auto",  # chaos names the aggregator's store
        "onceflow.stores.redis.url": f"redis://127.0.0.1:{nowhere}/0",
        "onceflow.stores.cassandra.contact-points": "127.0.0.1",
        "onceflow.stores.cassandra.port": str(nowhere),
    }
    options = ChaosOptions(messages=12_000, duration=20.0, kills=10, seed=seed,
                           store="cassandra", resend=0.0, republisher_dedup=False,
                           timeout=150.0)
    report = run_chaos(options, bootstrap=kafka_service.address,
                       store_settings=store_settings("cassandra", cassandra_service,
                                                     unique_name("nostore")),
                       workdir=tmp_path, worker_settings={"republisher": republisher})
    context = f"seed={seed}, logs in {tmp_path}: {report}"
    print(f"kills {report.kills}, events {report.events}, normalized {report.normalized}, "
          f"duplicates {report.duplicates}, windows {report.windows}, lost {report.lost}, "
          f"double {report.double}, {report.elapsed:.0f} s")
    assert report.caught_up, context
    assert report.kills == {"republisher": 5, "aggregator": 5}, context
    assert report.windows["per_robot_minute"] > 1_000, context
    assert report.lost == 0 and report.double == 0, context
    assert report.mismatched == {"per_robot_minute": 0, "per_robot_day": 0}, context
    assert report.late_twice == 0, context
    # The kills made the republisher write some reports twice (a unit each); the
    # aggregator discarded their events by the chain (its own replays add to these).
    resent = report.normalized - report.messages
    assert resent > 0, context
    assert report.duplicates["per_robot_minute"] >= resent, context
    assert report.exit_codes == {"republisher": 0, "aggregator": 0}, context
    logs = sorted(tmp_path.glob("republisher-*.log"))
    assert len(logs) == 6, context  # the first start and one per kill
    for log in logs:
        text = log.read_text(errors="replace")
        assert "stores: none (" in text, log
        # It never tried a store: no start-up access check, no retried store call.
        assert "does not answer" not in text and " onceflow.stores.retry: " not in text, log
