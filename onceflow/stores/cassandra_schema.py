"""The Cassandra store's schema: keyspace and tables, created only where missing, and
the statements prepared on them.

The layout and why it is so are in :mod:`onceflow.stores.cassandra_store`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from cassandra.cluster import Session
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_SCAN_PAGE = 1000  # rows per page of a scan or outbox load

#: Seconds a schema change may take. A change waits for every node to agree on the
#: new schema, which takes far longer than a row write on a loaded cluster, and it
#: runs once at start: a tight ``request-timeout`` meant for writes must not fail it.
SCHEMA_TIMEOUT = 60.0

STATES_TABLE = "states"
STATS_TABLE = "stats"
OUTBOX_TABLE = "outbox"
HOMES_TABLE = "homes"
EPOCHS_TABLE = "epochs"
TABLES = (STATES_TABLE, STATS_TABLE, OUTBOX_TABLE, HOMES_TABLE, EPOCHS_TABLE)


def schema_statements(keyspace: str, replication: Mapping[str, str | int]) -> list[str]:
    """The CQL that creates the keyspace, then each of :data:`TABLES` (each ``IF NOT EXISTS``)."""
    options = ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in replication.items())
    return [
        f'CREATE KEYSPACE IF NOT EXISTS "{keyspace}" WITH replication = {{{options}}}',
        f'CREATE TABLE IF NOT EXISTS "{keyspace}".{STATES_TABLE} (pipeline text, stage text, '
        "key text, value blob, PRIMARY KEY ((pipeline, stage, key)))",
        f'CREATE TABLE IF NOT EXISTS "{keyspace}".{STATS_TABLE} (pipeline text, name text, '
        "value counter, PRIMARY KEY ((pipeline), name))",
        f'CREATE TABLE IF NOT EXISTS "{keyspace}".{OUTBOX_TABLE} (pipeline text, lane text, '
        "seq bigint, value blob, PRIMARY KEY ((pipeline), lane, seq)) "
        "WITH gc_grace_seconds = 3600",
        f'CREATE TABLE IF NOT EXISTS "{keyspace}".{HOMES_TABLE} (pipeline text, stage text, '
        "key text, home text, PRIMARY KEY ((pipeline, stage, key)))",
        f'CREATE TABLE IF NOT EXISTS "{keyspace}".{EPOCHS_TABLE} (pipeline text, name text, '
        "value bigint, PRIMARY KEY ((pipeline), name))",
    ]


#: What Cassandra answers a schema change racing another client's (workers starting
#: together on a fresh keyspace): a table created before the keyspace it just saw
#: created is visible, the same table created twice with two ids, or a statement
#: prepared on a table the other client's change has not finished configuring.
_SCHEMA_RACES = ("non existing keyspace", "ID mismatch", "unconfigured columnfamily")


def _is_race(error: BaseException) -> bool:
    return any(race in str(error) for race in _SCHEMA_RACES)


def with_schema(session: Session, keyspace: str, replication: Mapping[str, str | int],
                prepare: Callable[[], T]) -> T:
    """Create the keyspace and tables the cluster's schema metadata lacks, then
    ``prepare`` the statements on them.

    A change or a prepare that lost a race with another client's schema change is
    tried again after a random pause (the racers drift apart), against freshly read
    schema metadata.
    """
    def refresh(state: RetryCallState) -> None:
        log.info("schema of %r: another client changed it at the same time; again", keyspace)
        session.cluster.refresh_schema_metadata()

    def create_and_prepare() -> T:
        _create_missing(session, keyspace, replication)
        return prepare()

    retrying = Retrying(retry=retry_if_exception(_is_race), stop=stop_after_attempt(8),
                        wait=wait_random_exponential(multiplier=0.1, max=2),
                        before_sleep=refresh, reraise=True)
    return retrying(create_and_prepare)


def _create_missing(session: Session, keyspace: str, replication: Mapping[str, str | int]
                    ) -> None:
    create_keyspace, *create_tables = schema_statements(keyspace, replication)
    existing = session.cluster.metadata.keyspaces.get(keyspace)
    if existing is None:
        log.info("creating keyspace %r with replication %s", keyspace, dict(replication))
        session.execute(create_keyspace, timeout=SCHEMA_TIMEOUT)
    tables = set() if existing is None else set(existing.tables)
    for table, create in zip(TABLES, create_tables, strict=True):
        if table not in tables:
            session.execute(create, timeout=SCHEMA_TIMEOUT)  # waits for schema agreement


def _literal(value: str | int) -> str:
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


class Statements:
    """The prepared statements of one keyspace."""

    def __init__(self, session: Session, keyspace: str) -> None:
        states, stats = f'"{keyspace}".{STATES_TABLE}', f'"{keyspace}".{STATS_TABLE}'
        self.insert = session.prepare(
            f"INSERT INTO {states} (pipeline, stage, key, value) VALUES (?, ?, ?, ?) "
            "USING TTL ? AND TIMESTAMP ?"
        )
        self.insert.is_idempotent = True  # the same value again: safe to retry
        self.select = session.prepare(
            f"SELECT value FROM {states} WHERE pipeline = ? AND stage = ? AND key = ?"
        )
        self.select.is_idempotent = True
        self.scan = session.prepare(f"SELECT pipeline, stage, key, value FROM {states}")
        self.scan.fetch_size = _SCAN_PAGE
        self.increment = session.prepare(
            f"UPDATE {stats} SET value = value + ? WHERE pipeline = ? AND name = ?"
        )
        self.stats = session.prepare(f"SELECT name, value FROM {stats} WHERE pipeline = ?")
        outbox = f'"{keyspace}".{OUTBOX_TABLE}'
        self.outbox_insert = session.prepare(
            f"INSERT INTO {outbox} (pipeline, lane, seq, value) VALUES (?, ?, ?, ?)"
        )
        self.outbox_insert.is_idempotent = True
        self.outbox_delete = session.prepare(
            f"DELETE FROM {outbox} WHERE pipeline = ? AND lane = ? AND seq = ?"
        )
        self.outbox_delete.is_idempotent = True
        self.outbox_select = session.prepare(
            f"SELECT lane, seq, value FROM {outbox} WHERE pipeline = ?"
        )
        self.outbox_select.fetch_size = _SCAN_PAGE
        self.outbox_select.is_idempotent = True
        self.home_claim = session.prepare(
            f'INSERT INTO "{keyspace}".{HOMES_TABLE} (pipeline, stage, key, home) '
            "VALUES (?, ?, ?, ?) IF NOT EXISTS"
        )
        # A retry after a timeout that did apply finds our own claim: the same answer.
        self.home_claim.is_idempotent = True
