"""The shipped Grafana dashboard and Prometheus alerts query only what a worker exports.

A worker with an exclusive republish and an aggregate is SIGKILLed after some
outputs, and its successor (metrics port on) replays from offset 0. Its
/metrics must hold every metric deploy/grafana/onceflow.json and
deploy/prometheus/alerts.yml name, each sample labelled with the pipeline,
and count the outputs it republished and those the replay skipped as already
written.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_exclusive_republish import PARTITIONS, drained, items, wait_killed

from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo, free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "onceflow.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
#: PromQL words that are not metric names.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "inf", "nan", "atan2"}
#: Series that only a feature this pipeline lacks creates (a ProducerDedup's re-sends).
FEATURE_ONLY = {"onceflow_producer_duplicates_total"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers not called as functions,
    outside strings, label matchers, ranges and by/on/... label lists."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables ($__rate_interval, $pipeline)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    return {name for name, call in re.findall(r"([A-Za-z_:][\w:]*)\s*(\(?)", expr)
            if not call and name.lower() not in KEYWORDS}


def queried() -> dict[str, set[str]]:
    """Every metric the dashboard and the alerts read, with where it is read."""
    where: dict[str, set[str]] = {}

    def note(source: str, expr: str) -> None:
        for name in metric_names(expr):
            where.setdefault(name, set()).add(source)

    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            note(f"panel {panel['title']!r}", target["expr"])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query["query"])
            assert found, query
            where.setdefault(found[1], set()).add(f"variable {variable['name']}")
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            note(f"alert {rule['alert']}", rule["expr"])
    return where


def test_the_query_parser_finds_names_and_skips_functions_and_labels() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, store) (rate('
                        'x_bucket{pipeline=~"$pipeline"}[$__rate_interval])))') == {"x_bucket"}
    assert metric_names("sum by (pipeline) (a) > 0 and on (pipeline, instance) "
                        "(time() - b) > 300") == {"a", "b"}


def samples(text: str) -> Iterator[Any]:
    for family in text_string_to_metric_families(text):
        yield from family.samples


def test_every_metric_the_dashboard_and_alerts_query_is_exported(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    source, output = unique_name("in"), unique_name("out")
    for topic in (source, output):
        asyncio.run(harness.create_topic(kafka_service.address, topic, PARTITIONS))
    ends = asyncio.run(harness.produce(kafka_service.address, source, items(200)))
    total = sum(1 + i * 7 % 5 for i in range(200))  # items() gives item i that many parts
    group, prefix, port = unique_name("g"), unique_name("p"), free_port()
    here = str(Path(__file__).parent)
    env = {**os.environ, "ONCEFLOW_MIRROR_TOPIC": source, "ONCEFLOW_MIRROR_OUTPUT": output,
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}

    def worker(name: str, extra: dict[str, str], fault: dict[str, str]) -> harness.WorkerProcess:
        settings = {"onceflow.pipeline": "metrics_pipeline:pipeline",
                    "onceflow.kafka.bootstrap-servers": kafka_service.address,
                    "onceflow.kafka.group-id": group,
                    "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                    "onceflow.stores.redis.key-prefix": prefix, **extra}
        argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
        process = harness.WorkerProcess(argv, {**env, **fault}, tmp_path, name)
        process.start()
        return process

    # Outputs sent, inputs never committed: the successor replays from offset 0.
    dying = worker("dying", {"onceflow.commit.interval": "1h"},
                   {"ONCEFLOW_FAULT_KILL_AFTER_SENDS": str(total // 2)})
    wait_killed(dying)
    before = asyncio.run(harness.read_all(kafka_service.address, output, PARTITIONS, quiet=1.0))
    assert 0 < len(before) < total
    successor = worker("successor", {"onceflow.metrics.port": str(port),
                                     "onceflow.commit.interval": "500ms"}, {})
    try:
        asyncio.run(drained(kafka_service, group, source, ends, successor))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    finally:
        assert successor.terminate(10) == 0
    exported = list(samples(text))
    names = {sample.name for sample in exported}
    missing = {name: sorted(where) for name, where in queried().items()
               if name not in names and name not in FEATURE_ONLY}
    assert not missing, f"queried but not exported: {missing}"
    families = {family.name for family in text_string_to_metric_families(text)}
    assert {name.removesuffix("_total") for name in FEATURE_ONLY} <= families
    assert {sample.labels.get("pipeline") for sample in exported} == {"deploy-metrics"}

    def value(name: str, **labels: str) -> float:
        return sum(s.value for s in exported if s.name == name
                   and labels.items() <= s.labels.items())

    # Each output once: what the dying worker wrote is skipped, the rest republished.
    assert value("onceflow_exclusive_skipped_total", topic=output) == len(before)
    assert value("onceflow_republished_total", topic=output) == total - len(before)
    assert value("onceflow_records_total") == 200
    outputs = asyncio.run(harness.read_all(kafka_service.address, output, PARTITIONS, quiet=1.0))
    assert len(outputs) == total
