"""Outbox calls against stores that cannot be reached (no server needed).

Empty calls must not touch the network (the persistence path calls them
every flush); anything else must raise the error callers retry on.
"""

from __future__ import annotations

import socket

import pytest
import redis

from onceflow.stores.base import StateStore
from onceflow.stores.cassandra_store import CassandraStore, CassandraUnavailable
from onceflow.stores.redis_store import RedisStore


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens once the socket is closed


@pytest.fixture(params=["redis", "cassandra"])
def offline(request: pytest.FixtureRequest) -> tuple[StateStore, type[Exception]]:
    port = closed_port()
    if request.param == "redis":
        store: StateStore = RedisStore(f"redis://127.0.0.1:{port}/0", "ns", "p", timeout=1.0)
        error: type[Exception] = redis.ConnectionError
    else:
        store = CassandraStore(["127.0.0.1"], "p", port=port, protocol_version=3,
                               connect_timeout=1.0)
        error = CassandraUnavailable
    request.addfinalizer(store.close)
    return store, error


def test_empty_outbox_writes_make_no_network_call(
    offline: tuple[StateStore, type[Exception]]
) -> None:
    store, _ = offline
    store.outbox_append({})
    store.outbox_remove([])


def test_outbox_calls_on_an_unreachable_store_raise_the_retried_error(
    offline: tuple[StateStore, type[Exception]]
) -> None:
    store, error = offline
    with pytest.raises(error):
        store.outbox_append({("orders|0", 1): b"r"})
    with pytest.raises(error):
        store.outbox_remove([("orders|0", 1)])
    with pytest.raises(error):
        store.outbox_load()
