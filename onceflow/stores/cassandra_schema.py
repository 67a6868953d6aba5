"""The Cassandra store's schema: keyspace and tables, created only where missing.

The layout and why it is so are in :mod:`onceflow.stores.cassandra_store`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from cassandra.cluster import Session

log = logging.getLogger(__name__)

STATES_TABLE = "states"
STATS_TABLE = "stats"
OUTBOX_TABLE = "outbox"
HOMES_TABLE = "homes"
TABLES = (STATES_TABLE, STATS_TABLE, OUTBOX_TABLE, HOMES_TABLE)


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
    ]


def create_schema(session: Session, keyspace: str, replication: Mapping[str, str | int]
                  ) -> None:
    """Create the keyspace and tables the cluster's schema metadata lacks."""
    create_keyspace, *create_tables = schema_statements(keyspace, replication)
    existing = session.cluster.metadata.keyspaces.get(keyspace)
    if existing is None:
        log.info("creating keyspace %r with replication %s", keyspace, dict(replication))
        session.execute(create_keyspace)
    tables = set() if existing is None else set(existing.tables)
    for table, create in zip(TABLES, create_tables, strict=True):
        if table not in tables:
            session.execute(create)  # the driver waits for schema agreement


def _literal(value: str | int) -> str:
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"
