"""Workers started together on a fresh Cassandra keyspace all get the schema.

Each store creates the keyspace and tables it misses (``cassandra_schema``).
Several processes doing it at once used to fail one of them: its ``CREATE
TABLE`` answered "non existing keyspace" just after its ``CREATE KEYSPACE
IF NOT EXISTS`` returned (a chaos test's republisher exited 1 at start with
it). Threads stand in for the processes: each store has its own session.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from onceflow.devtools.services import ServiceInfo
from onceflow.stores.cassandra_store import CassandraStore

STORES, ROUNDS = 4, 4


def test_stores_creating_one_keyspace_at_once_all_succeed(
    cassandra_service: ServiceInfo, unique_name: Callable[..., str]
) -> None:
    for _ in range(ROUNDS):
        keyspace = unique_name("race")
        stores = [CassandraStore([cassandra_service.host], f"p{n}", port=cassandra_service.port,
                                 keyspace=keyspace, protocol_version=3) for n in range(STORES)]
        try:
            with ThreadPoolExecutor(STORES) as pool:
                errors = list(pool.map(lambda store: store.check_access(), stores))
            assert errors == [None] * STORES, errors
            stores[0].save("stage", {"k": b"v"})
            assert stores[0].load("stage", ["k"]) == {"k": b"v"}
        finally:
            for store in stores:
                store.close()
