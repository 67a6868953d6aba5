"""Cassandra state store: one row per state, written with one INSERT.

A row holds the state and its watermarks in one ``value`` blob and the whole
primary key is the partition key, so every write is one single-partition,
single-row mutation: atomic and isolated (docs/architecture.md, invariant
4). A batch of rows goes out as concurrent prepared INSERTs, each routed to a
replica of its row (a multi-partition BATCH would add coordinator work and
atomicity no caller needs). Only CQL that Cassandra 2.1 and 4/5 share is used::

    CREATE KEYSPACE IF NOT EXISTS "<keyspace>"
        WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};
    CREATE TABLE IF NOT EXISTS "<keyspace>".states (
        pipeline text, stage text, key text, value blob,
        PRIMARY KEY ((pipeline, stage, key)));
    CREATE TABLE IF NOT EXISTS "<keyspace>".stats (
        pipeline text, name text, value counter,
        PRIMARY KEY ((pipeline), name));
    CREATE TABLE IF NOT EXISTS "<keyspace>".outbox (
        pipeline text, lane text, seq bigint, value blob,
        PRIMARY KEY ((pipeline), lane, seq))
        WITH gc_grace_seconds = 3600;
    CREATE TABLE IF NOT EXISTS "<keyspace>".homes (
        pipeline text, stage text, key text, home text,
        PRIMARY KEY ((pipeline, stage, key)));
    CREATE TABLE IF NOT EXISTS "<keyspace>".epochs (
        pipeline text, name text, value bigint,
        PRIMARY KEY ((pipeline), name));

Rows are written ``USING TTL``: 0 (never) but for history rows under a retention and
states under an expiry (``expire_after``); an expired row keeps its write timestamp, so a
late row a fenced-out writer stamped lower does not bring it back (until compaction
purges it, gc_grace_seconds after).

Fenced: epochs live in the ``epochs`` table, and state rows are written
``USING TIMESTAMP`` of their epoch, after a check of the guard's epochs
(``onceflow.stores.fencing.cassandra_fence``).

A key's home (the one input partition allowed to feed its state) is claimed
with a lightweight transaction (``INSERT ... IF NOT EXISTS``), once per key
in its lifetime.

The outbox (records not yet delivered to Kafka) is one partition per
pipeline, so loading it is one paged read that comes back already ordered
by lane and seq. It only holds records of a delivery that failed, but each
one delivered later leaves a tombstone, and a read that meets more than
Cassandra's ``tombstone_failure_threshold`` (100,000) fails: hence the short
``gc_grace_seconds``. A deleted row a lagging replica brings back is only
sent again, a duplicate downstream discards. Outages that outbox more than
~100,000 records an hour want the Redis outbox (the default).

The keyspace and tables are created on first use only if the schema metadata
lacks them, so a schema created ahead of time (recommended on multi-node
clusters: concurrent CREATE TABLE on different coordinators can disagree)
needs no CREATE permission.

Reads see every acknowledged write if the consistency level makes reads and
writes overlap (LOCAL_QUORUM, the default, does in one datacenter; the settings
refuse levels that do not). Write order between saves of one key rests on the
epoch timestamps above, not on clocks.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cassandra import (
    ConsistencyLevel,
    CoordinationFailure,
    OperationTimedOut,
    Timeout,
    Unauthorized,
    Unavailable,
)
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.connection import ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import PreparedStatement, Statement, tuple_factory

from onceflow.shared_types import TopicPartition
from onceflow.stores.access import NO_ACCESS, StoreAccess, access_denied, cassandra_options
from onceflow.stores.base import OutboxKey, StateStore
from onceflow.stores.cassandra_schema import (
    EPOCHS_TABLE,
    STATES_TABLE,
    TABLES,
    Statements,
    with_schema,
)
from onceflow.stores.fencing import Guard, Taken
from onceflow.stores.fencing.cassandra_fence import CassandraFence, WriteClock

__all__ = ["CONSISTENCY_LEVELS", "TABLES", "CassandraStore", "CassandraUnavailable"]

log = logging.getLogger(__name__)

#: Levels usable for both reads and writes in 2.1 and 4/5 (ANY cannot read,
#: SERIAL/LOCAL_SERIAL are for lightweight transactions, EACH_QUORUM reads
#: need 3.0+).
CONSISTENCY_LEVELS = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_ONE", "LOCAL_QUORUM")
SIMPLE_STRATEGY: Mapping[str, str | int] = {"class": "SimpleStrategy", "replication_factor": 1}
# What a busy or briefly unreachable cluster raises; retried by the caller.
_TRANSIENT = (
    Timeout,  # ReadTimeout, WriteTimeout (coordinator waited for replicas)
    OperationTimedOut,  # client-side request timeout
    Unavailable,
    CoordinationFailure,  # ReadFailure, WriteFailure
    NoHostAvailable,
    ConnectionException,
)


# Refusals: a wrong login (inside NoHostAvailable) or a missing permission (CREATE).
_REFUSED = (Unauthorized,)


class CassandraUnavailable(ConnectionError):
    """Cassandra did not answer in time or not enough replicas were up; worth retrying.

    A ``ConnectionError`` so that store callers' retry policies treat it as
    transient; the driver's own exception is the ``__cause__``. A failed
    ``save`` may have written some of its rows: saving them again is safe.
    """


class CassandraStore(StateStore):
    """States of one pipeline in one Cassandra keyspace (shared by many pipelines); fenced.

    The constructor does no I/O: the first call connects, creates what is
    missing of the schema and prepares the statements, so a worker starts
    while Cassandra is still coming up and its first load is retried.

    Args:
        contact_points: hosts to discover the cluster from.
        pipeline_id: the pipeline whose rows this store reads and writes.
        port: the native-protocol (CQL) port.
        keyspace: lowercase CQL identifier; created if missing.
        replication: the keyspace's CQL replication map, used only to create it.
        protocol_version: 0 lets the driver negotiate (fails against 2.1: use 3).
        local_datacenter: the datacenter to send requests to; None picks the
            datacenter of the first contact point that answers.
        consistency: one of :data:`CONSISTENCY_LEVELS`, for reads and writes.
        connect_timeout: seconds to open a connection.
        request_timeout: seconds before a request fails client-side.
        concurrency: most requests in flight per ``save``/``load``.
        history_retention: seconds after which history rows expire; 0: never.
        access: the login (PasswordAuthenticator) and TLS (client encryption).
    """

    fenced = True

    def __init__(
        self,
        contact_points: Sequence[str],
        pipeline_id: str,
        *,
        port: int = 9042,
        keyspace: str = "onceflow",
        replication: Mapping[str, str | int] = SIMPLE_STRATEGY,
        protocol_version: int = 0,
        local_datacenter: str | None = None,
        consistency: str = "LOCAL_QUORUM",
        connect_timeout: float = 5.0,
        request_timeout: float = 10.0,
        concurrency: int = 128,
        history_retention: float = 0.0,
        access: StoreAccess = NO_ACCESS,
    ) -> None:
        if consistency not in CONSISTENCY_LEVELS:
            raise ValueError(f"consistency {consistency!r}: expected one of {CONSISTENCY_LEVELS}")
        if concurrency < 1:
            raise ValueError(f"concurrency {concurrency}: expected at least 1")
        self.history_retention = history_retention
        self._pipeline = pipeline_id
        self._keyspace = keyspace
        self._replication = dict(replication)
        self._concurrency = concurrency
        options: dict[str, Any] = {"protocol_version": protocol_version} if protocol_version else {}

        def new_cluster() -> Cluster:
            profile = ExecutionProfile(
                load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_datacenter)),
                consistency_level=ConsistencyLevel.name_to_value[consistency],
                request_timeout=request_timeout,
                row_factory=tuple_factory,
            )
            return Cluster(
                list(contact_points),
                port=port,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                connect_timeout=connect_timeout,
                control_connection_timeout=max(connect_timeout, 2.0),
                **options, **cassandra_options(access),
            )

        self._new_cluster = new_cluster
        self._cluster = new_cluster()
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._statements: Statements | None = None
        self._fence: CassandraFence | None = None
        self._epochs_here = True
        self._clock = WriteClock()

    # --- StateStore ---------------------------------------------------------

    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        st = self._ready()
        results = self._run_all(st.select, [(self._pipeline, stage_id, k) for k in keys])
        rows: dict[str, bytes] = {}
        for key, result in zip(keys, results, strict=True):
            row = result.one()
            if row is not None:
                rows[key] = row[0]
        return rows

    def row_name(self, stage_id: str, key: str) -> str:
        return (f'cassandra table "{self._keyspace}".{STATES_TABLE} row (pipeline, stage, key) '
                f"= ({self._pipeline!r}, {stage_id!r}, {key!r})")

    def save(self, stage_id: str, rows: Mapping[str, bytes], ttl: float = 0, *,
             guard: Guard | None = None) -> None:
        if not rows:
            return
        st = self._ready()
        if guard:
            self.check_epochs(guard)
        stamp = self._clock.next(guard)
        # TTL 0: the row never expires; else whole seconds, rounded up
        self._run_all(st.insert, [(self._pipeline, stage_id, k, v, math.ceil(ttl), stamp)
                                  for k, v in rows.items()])

    def save_expiring(self, stage_id: str, rows: Mapping[str, bytes], ttl: float, *,
                      guard: Guard | None = None) -> None:
        self.save(stage_id, rows, ttl, guard=guard)

    def take_epochs(self, partitions: Sequence[TopicPartition], floor: int = 0) -> Taken:
        self._ready()
        assert self._fence is not None
        taken = self._fence.take(partitions, floor)
        self._clock.saw(taken.epoch)
        return taken

    def check_epochs(self, guard: Guard) -> None:
        if self._epochs_here:
            self._ready()
            assert self._fence is not None
            self._fence.check(guard)

    def epochs_elsewhere(self) -> None:
        self._epochs_here = False

    def raise_counter(self, epoch: int) -> int:
        self._ready()
        assert self._fence is not None
        return self._fence.raise_counter(epoch)

    def scan(self, stage_id: str) -> Iterator[tuple[str, bytes]]:
        """Every row of ``stage_id``, paging through the whole table.

        The partition key is the whole primary key, so Cassandra cannot
        select one pipeline's stage without reading every partition; rows of
        other pipelines and stages are read and dropped here. Correct, not
        fast: for verification; analytics split the table by token range.
        """
        for pipeline, stage, key, value in self._run(self._ready().scan, ()):
            if pipeline == self._pipeline and stage == stage_id:
                yield key, value

    def claim_homes(self, stage_id: str, proposals: Mapping[str, str]) -> dict[str, str]:
        """One lightweight transaction per key; a claim that lost answers the winner's home."""
        if not proposals:
            return {}
        results = self._run_all(self._ready().home_claim,
                                [(self._pipeline, stage_id, k, h) for k, h in proposals.items()])
        homes: dict[str, str] = {}
        for (key, proposed), result in zip(proposals.items(), results, strict=True):
            row = dict(zip(result.column_names, result.one(), strict=True))
            homes[key] = proposed if row["[applied]"] else row["home"]
        return homes

    def outbox_append(self, rows: Mapping[OutboxKey, bytes], *, guard: Guard | None = None) -> None:
        if rows:
            if guard:
                self.check_epochs(guard)
            self._run_all(self._ready().outbox_insert,
                          [(self._pipeline, lane, seq, v) for (lane, seq), v in rows.items()])

    def outbox_remove(self, keys: Sequence[OutboxKey]) -> None:
        if keys:
            self._run_all(self._ready().outbox_delete,
                          [(self._pipeline, lane, seq) for lane, seq in keys])

    def outbox_load(self) -> dict[str, list[tuple[int, bytes]]]:
        lanes: dict[str, list[tuple[int, bytes]]] = {}
        for lane, seq, value in self._run(self._ready().outbox_select, (self._pipeline,)):
            lanes.setdefault(lane, []).append((seq, value))  # clustered: already by seq
        return lanes

    def add_stats(self, counters: Mapping[str, int]) -> None:
        """Add the non-zero counters; on a transient failure log and drop them.

        A counter increment that timed out may still have been applied, so
        trying again could count twice; dropping keeps the counters lower
        bounds, which is all the stats promise.
        """
        params = [(amount, self._pipeline, name) for name, amount in counters.items() if amount]
        if not params:
            return
        try:
            self._run_all(self._ready().increment, params)
        except CassandraUnavailable as error:
            log.warning("stats not recorded (%s): %s", error, dict(counters))

    def read_stats(self) -> dict[str, int]:
        rows = self._run(self._ready().stats, (self._pipeline,))
        return {name: int(value) for name, value in rows}

    def check_access(self) -> Exception | None:
        """Log in, set up the schema; the error if no node answered (refusals raise)."""
        try:
            self._ready()
        except CassandraUnavailable as error:
            return error
        return None

    def close(self) -> None:
        self._cluster.shutdown()

    # --- connection, schema, statements -------------------------------------

    def _ready(self) -> Statements:
        """Connect, create what is missing of the schema, prepare the statements; once."""
        with self._lock:
            if self._statements is None:
                try:
                    if self._session is None:
                        self._session = self._cluster.connect()
                    session = self._session
                    self._statements, self._fence = with_schema(
                        session, self._keyspace, self._replication,
                        lambda: (Statements(session, self._keyspace), CassandraFence(
                            session, f'"{self._keyspace}".{EPOCHS_TABLE}', self._pipeline,
                            self._execute)))
                except (*_TRANSIENT, *_REFUSED) as error:
                    if self._session is None:
                        # The driver shuts a Cluster down when its first connect
                        # fails; the next try needs a new one.
                        self._cluster = self._new_cluster()
                    denied = access_denied(error)
                    if denied is not None:
                        raise denied from error
                    raise CassandraUnavailable(f"cannot set up Cassandra: {error!r}") from error
            return self._statements

    def _run_all(self, statement: PreparedStatement, params: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``statement`` once per parameter tuple, in parallel; raise if any run failed.

        Waits for every request before raising, so nothing of this call is
        still in flight when the caller retries or moves on.
        """
        results = execute_concurrent_with_args(
            self._session, statement, params,
            concurrency=min(self._concurrency, len(params)), raise_on_first_error=False,
        )
        failures = [result for ok, result in results if not ok]
        if failures:
            first = failures[0]
            message = f"{len(failures)} of {len(params)} requests failed, first: {first!r}"
            if isinstance(first, _TRANSIENT):
                raise CassandraUnavailable(message) from first
            first.add_note(message)
            raise first
        return [result for _, result in results]

    def _run(self, statement: Statement, params: tuple[Any, ...] | None
             ) -> Iterator[tuple[Any, ...]]:
        """Execute one statement, fetching further pages as the rows are consumed."""
        assert self._session is not None
        try:
            yield from self._session.execute(statement, params)
        except _TRANSIENT as error:
            raise CassandraUnavailable(repr(error)) from error

    def _execute(self, statement: Statement, params: tuple[Any, ...] | None
                 ) -> list[tuple[Any, ...]]:
        return list(self._run(statement, params))
