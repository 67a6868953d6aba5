"""Workers started together on a fresh Cassandra keyspace all get the schema.

Each store creates the keyspace and tables it misses (``cassandra_schema``).
Several processes doing it at once used to fail one of them: its ``CREATE
TABLE`` answered "non existing keyspace" just after its ``CREATE KEYSPACE
IF NOT EXISTS`` returned (a chaos test's republisher exited 1 at start with
it). Threads stand in for the processes: each store has its own session.

A store whose node does not answer yet (``check_access`` answers ``CassandraUnavailable``)
is retried, as the worker retries it (``runtime.wiring.check_store_access`` starts and
lets its calls retry): under a loaded host Cassandra 2.1 sometimes answers one of four
concurrent schema changes with "Server error", and the driver marks the node down until
it reconnects. A lost race raises instead, and fails the test at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from onceflow.devtools.services import ServiceInfo
from onceflow.stores.cassandra_store import CassandraStore

STORES, ROUNDS = 4, 4
TRIES, PAUSE = 10, 1.0  # a node marked down is reconnected within a few seconds


def set_up(store: CassandraStore) -> Exception | None:
    """``check_access`` until the node answers (or ``TRIES`` times); raises what it raises."""
    for _ in range(TRIES - 1):
        error = store.check_access()
        if error is None:
            return None
        time.sleep(PAUSE)
    return store.check_access()


def test_stores_creating_one_keyspace_at_once_all_succeed(
    cassandra_service: ServiceInfo, unique_name: Callable[..., str]
) -> None:
    for _ in range(ROUNDS):
        keyspace = unique_name("race")
        stores = [CassandraStore([cassandra_service.host], f"p{n}", port=cassandra_service.port,
                                 keyspace=keyspace, protocol_version=3) for n in range(STORES)]
        try:
            with ThreadPoolExecutor(STORES) as pool:
                errors = list(pool.map(set_up, stores))
            assert errors == [None] * STORES, errors
            stores[0].save("stage", {"k": b"v"})
            assert stores[0].load("stage", ["k"]) == {"k": b"v"}
        finally:
            for store in stores:
                store.close()
