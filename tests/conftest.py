"""Shared fixtures: real services on free ports, unique names per test.

A service that cannot start makes its fixture raise, so the tests using it
fail with the reason (never skip): the project installs its own services.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.devtools import services
from onceflow.devtools.services import ServiceInfo


def _run(
    start: Callable[[Path], ServiceInfo], tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[ServiceInfo]:
    info = start(tmp_path_factory.mktemp(name))
    try:
        yield info
    finally:
        services.stop(info)


@pytest.fixture(scope="session")
def kafka_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceInfo]:
    """A Tansu (Kafka protocol) broker for the whole session; memory storage."""
    yield from _run(services.start_tansu, tmp_path_factory, "kafka")


@pytest.fixture(scope="session")
def redis_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceInfo]:
    """A private Redis (AOF, fsync always) for the whole session."""
    yield from _run(services.start_redis, tmp_path_factory, "redis")


@pytest.fixture(scope="session")
def cassandra_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceInfo]:
    """A private Cassandra 2.1 (batch commitlog) for the whole session."""
    yield from _run(services.start_cassandra, tmp_path_factory, "cassandra")


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[..., str]:
    """``unique_name(prefix="t")`` -> a fresh name valid as a topic, group or keyspace.

    Only ``[a-z0-9_]`` and at most 48 characters (Cassandra's keyspace limit).
    """
    test = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:20]
    counter = itertools.count()

    def make(prefix: str = "t") -> str:
        return f"{prefix[:12]}_{test}_{next(counter)}_{uuid.uuid4().hex[:8]}"

    return make
