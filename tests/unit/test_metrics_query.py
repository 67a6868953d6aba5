"""/metrics with ``name[]``: only the samples asked for (prometheus_client's own query),
so a poller that reads one counter often does not have every family rendered each time."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import Counter

from onceflow.actors import metrics
from onceflow.runtime.health import HealthServer


@pytest.fixture
def server() -> Iterator[HealthServer]:
    served = HealthServer("127.0.0.1", 0, lambda: {"healthy": True}, pipeline="asked")
    served.start(lambda child, error: None)
    try:
        yield served
    finally:
        served.stop()


def _get(server: HealthServer, path: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as answer:
        return answer.read().decode().splitlines()


def _samples(lines: list[str]) -> list[str]:
    return [line for line in lines if line and not line.startswith("#")]


def test_the_names_asked_for_and_nothing_else(server: HealthServer) -> None:
    metrics.RECORDS.inc(3)
    metrics.COMMITTED.labels("asked-topic", "2").set(41)
    everything = _samples(_get(server, "/metrics"))
    assert any(line.startswith("onceflow_commit_seconds") for line in everything)
    asked = _samples(_get(server, "/metrics?name[]=onceflow_records_total"
                                  "&name[]=onceflow_committed_offset"))
    assert asked and all(line.startswith(("onceflow_records_total{",
                                          "onceflow_committed_offset{")) for line in asked)
    assert [line for line in asked if line.startswith("onceflow_records_total{")] == [
        line for line in everything if line.startswith("onceflow_records_total{")]
    assert 'onceflow_committed_offset{partition="2",pipeline="asked",topic="asked-topic"} ' \
        '41.0' in asked
    assert len(asked) < len(everything)


def test_a_name_nothing_has_gives_an_empty_answer_and_health_takes_a_query(
        server: HealthServer) -> None:
    assert _samples(_get(server, "/metrics?name[]=no_such_metric")) == []
    assert _get(server, "/health?verbose=1") == ['{"healthy": true}']


def test_the_whole_page_still_declares_a_family_without_samples(server: HealthServer) -> None:
    # A labelled family no label set was used with yet: declared (HELP, TYPE) on the
    # whole page, as before, so a dashboard's query finds it; left out of a restricted one.
    unused = Counter("onceflow_unasked", "a family with labels and no samples yet", ["stage"],
                     registry=metrics.REGISTRY)
    try:
        assert "# TYPE onceflow_unasked_total counter" in _get(server, "/metrics")
        assert _get(server, "/metrics?name[]=onceflow_unasked_total") == []
    finally:
        metrics.REGISTRY.unregister(unused)
