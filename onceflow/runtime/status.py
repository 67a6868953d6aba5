"""``onceflow status``: a pipeline's lag per input partition, and a worker's health.

With ``-c app.conf`` the lag is read from Kafka (``onceflow.runtime.lag``), so it
shows with no worker running; ``--wait`` polls until every input partition has
lag 0 (exit 0) or ``--timeout`` passes (exit 1), for scripts and tests. The
worker's ``/health`` and ``/metrics`` are shown too when its endpoint is
configured (``--url`` asks an endpoint only, as before).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

from aiokafka.errors import KafkaError

from onceflow.runtime.config import ConfigError, Settings, load_settings
from onceflow.runtime.lag import GroupLag, read_lag

__all__ = ["cli"]

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="onceflow status",
        description="Lag of the pipeline's consumer group per input partition (from Kafka, "
                    "with or without a running worker), and the worker's /health and /metrics.")
    parser.add_argument("--url", help="only ask this worker endpoint, e.g. http://127.0.0.1:9464")
    parser.add_argument("-c", "--config", help="application HOCON file")
    parser.add_argument("--wait", action="store_true",
                        help="wait until every input partition has lag 0 (exit 0), or exit 1 "
                             "after --timeout")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds --wait waits at most (default 300)")
    parser.add_argument("--json", action="store_true", help="lag as JSON lines")
    args = parser.parse_args(argv)
    if args.url is not None:
        return _health(args.url)
    if args.config is None:
        parser.error("give -c or --url")
    try:
        settings = load_settings(args.config)
        from onceflow.runtime.wiring import load_pipeline

        topics = load_pipeline(settings).consumed_topics
    except ConfigError as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if args.wait:
        return _wait(settings, topics, args.timeout, args.json)
    lag = _lag(settings, topics)
    if lag is None:
        return EXIT_FAILED
    _print_lag(lag, args.json)
    m = settings.metrics
    if not m.port:
        return EXIT_OK
    return _health(f"http://{m.host}:{m.port}", absent_ok=True)


def _lag(settings: Settings, topics: tuple[str, ...]) -> GroupLag | None:
    from onceflow.runtime.wiring import consumer_options

    try:
        return read_lag(consumer_options(settings), settings.kafka.group_id, topics,
                        timeout=max(10.0, settings.kafka.request_timeout))
    except (KafkaError, OSError, TimeoutError) as error:
        print(f"onceflow: cannot read the lag from {settings.kafka.bootstrap_servers}: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return None


def _wait(settings: Settings, topics: tuple[str, ...], timeout: float, as_json: bool) -> int:
    deadline = time.monotonic() + timeout
    while True:
        lag = _lag(settings, topics)
        if lag is not None and lag.total == 0:
            _print_lag(lag, as_json)
            return EXIT_OK
        if time.monotonic() >= deadline:
            if lag is not None:
                _print_lag(lag, as_json)
            print(f"onceflow: not caught up after {timeout:g}s"
                  + (f": lag {lag.total}" if lag is not None else ""), file=sys.stderr)
            return EXIT_FAILED
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _print_lag(lag: GroupLag, as_json: bool) -> None:
    if as_json:
        for p in lag.partitions:
            print(json.dumps({"group": lag.group, "topic": p.topic, "partition": p.partition,
                              "committed": p.committed, "end": p.end, "lag": p.lag}))
        return
    print(f"group {lag.group}: lag {lag.total} over {len(lag.partitions)} partitions")
    rows = [("topic", "partition", "committed", "end", "lag")] + [
        (p.topic, str(p.partition), "-" if p.committed is None else str(p.committed),
         str(p.end), str(p.lag)) for p in lag.partitions]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for topic in lag.missing:
        print(f"{topic}: no such topic (yet)")


def _health(url: str, absent_ok: bool = False) -> int:
    """Print a worker's /health, then its onceflow_ metrics; 0 if it is healthy."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            health, code = json.load(response), response.status
    except urllib.error.HTTPError as error:
        health, code = json.load(error), error.code
    except OSError as error:
        print(f"onceflow: no worker answers at {url}: {error}", file=sys.stderr)
        return EXIT_OK if absent_ok else EXIT_FAILED
    print(json.dumps(health, indent=2))
    reasons = health.get("reasons") or ([] if code == 200 else [f"HTTP {code}"])
    print("worker: healthy" if not reasons else "worker: unhealthy: " + "; ".join(reasons))
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    print("\n".join(line for line in lines if line.startswith("onceflow_")
                    and "_created" not in line))
    return EXIT_OK if code == 200 else EXIT_FAILED
