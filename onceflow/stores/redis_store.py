"""Redis state store: one string key per state, written with MSET.

A key holds the state and its watermarks in one value, so every write is
atomic per key; a batch of writes is one MSET (atomic as a whole on one
node; on a cluster each key stays self-consistent: docs/architecture.md,
invariant 4).
Layout: ``<prefix>:<pipeline>:s:<stage>:<key>``, ``<prefix>:<pipeline>:stats``,
key homes in one hash per stage ``<prefix>:<pipeline>:home:<stage>`` (HSETNX),
history rows (``<stage>#history``) with a PX expiry when a retention is set,
states with one on each write when they expire (``save_expiring``: SET PX; a state
written by MSET loses any expiry it had), and the outbox, one hash
``<prefix>:<pipeline>:outbox`` of field ``<lane>|<seq>`` (split from the right: a lane
is ``<topic>|<partition>``) -> record.

A write given a guard (the epochs of the input partitions it depends on) is
one Lua script that checks them and writes, or refuses with ``Fenced``
(``onceflow.stores.fencing.redis_fence``); the epochs are ``<prefix>:<pipeline>:epoch:
<topic>|<partition>``, taken from the counter ``<prefix>:<pipeline>:#counter``.

With ``wait_replicas``, a write of states, history or outbox rows returns only
once that many replicas acknowledged it (``onceflow.stores.redis_durability``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import redis
from redis.client import Pipeline

from onceflow.shared_types import TopicPartition
from onceflow.stores.access import NO_ACCESS, StoreAccess, access_denied, redis_options
from onceflow.stores.base import OutboxKey, StateStore
from onceflow.stores.fencing import Guard, Taken
from onceflow.stores.fencing.redis_fence import RedisFence
from onceflow.stores.redis_durability import ReplicaWait, persistence_report

_GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


class RedisStore(StateStore):
    """``access`` logs in (AUTH, an ACL user) and sets up TLS (a ``rediss://`` URL);
    ``wait_replicas`` replicas acknowledge each write within ``wait_timeout`` s (0: none)."""

    fenced = atomic_fence = True

    def __init__(self, url: str, key_prefix: str, pipeline_id: str, timeout: float = 5.0,
                 history_retention: float = 0.0, *, access: StoreAccess = NO_ACCESS,
                 wait_replicas: int = 0, wait_timeout: float = 1.0):
        self.history_retention = history_retention
        self._acks = ReplicaWait(wait_replicas, wait_timeout)
        reply = timeout + (wait_timeout if wait_replicas else 0.0)  # WAIT blocks that long
        self._client = redis.Redis.from_url(
            url, socket_timeout=reply, socket_connect_timeout=timeout, **redis_options(access)
        )
        where = self._client.get_connection_kwargs()  # never the password: only the address
        self._where = str(where.get("path") or f"{where.get('host')}:{where.get('port')}")
        self._base = f"{key_prefix}:{pipeline_id}"
        self._outbox = f"{self._base}:outbox"
        self.fence = RedisFence(self._client, self._base, self._acks)

    def _key(self, stage_id: str, key: str) -> str:
        return f"{self._base}:s:{stage_id}:{key}"

    def row_name(self, stage_id: str, key: str) -> str:
        return f"redis key {self._key(stage_id, key)!r}"

    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self._client.mget([self._key(stage_id, k) for k in keys]))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def take_epochs(self, partitions: Sequence[TopicPartition], floor: int = 0) -> Taken:
        return self.fence.take(partitions, floor)

    def check_epochs(self, guard: Guard) -> None:
        self.fence.write(guard, "mset", {})

    def save(self, stage_id: str, rows: Mapping[str, bytes], *, guard: Guard | None = None
             ) -> None:
        if not rows:
            return
        named = {self._key(stage_id, key): value for key, value in rows.items()}
        if guard:
            self.fence.write(guard, "mset", named)
        else:
            self._acks.execute(self._client, lambda pipe: pipe.mset(named))

    def save_expiring(self, stage_id: str, rows: Mapping[str, bytes], ttl: float, *,
                      guard: Guard | None = None) -> None:
        """One SET PX per row, pipelined: one round trip, as MSET (which cannot expire)."""
        if not rows:
            return
        ttl_ms = max(1, round(ttl * 1000))
        if guard:
            self.fence.write(guard, "px", {self._key(stage_id, key): value
                                          for key, value in rows.items()}, px=ttl_ms)
            return

        def write(pipe: Pipeline) -> None:
            for key, value in rows.items():
                pipe.set(self._key(stage_id, key), value, px=ttl_ms)

        self._acks.execute(self._client, write)

    def scan(self, stage_id: str) -> Iterator[tuple[str, bytes]]:
        prefix = self._key(stage_id, "")
        pattern = prefix.translate(_GLOB_SPECIAL) + "*"
        batch: list[bytes] = []
        for name in self._client.scan_iter(match=pattern, count=1000):
            batch.append(cast(bytes, name))
            if len(batch) == 1000:
                yield from self._fetch(batch, len(prefix))
                batch = []
        yield from self._fetch(batch, len(prefix))

    def _fetch(self, names: list[bytes], cut: int) -> Iterator[tuple[str, bytes]]:
        if not names:
            return
        values = cast(list[bytes | None], self._client.mget(names))
        for name, value in zip(names, values, strict=True):
            if value is not None:
                yield name.decode()[cut:], value

    def claim_homes(self, stage_id: str, proposals: Mapping[str, str]) -> dict[str, str]:
        """HSETNX each key, then HMGET them all: one round trip, atomic per key."""
        if not proposals:
            return {}
        homes = f"{self._base}:home:{stage_id}"
        pipe = self._client.pipeline(transaction=False)
        for key, home in proposals.items():
            pipe.hsetnx(homes, key, home)
        pipe.hmget(homes, list(proposals))
        winners = cast(list[bytes], pipe.execute()[-1])
        return {key: won.decode() for key, won in zip(proposals, winners, strict=True)}

    def outbox_append(self, rows: Mapping[OutboxKey, bytes], *, guard: Guard | None = None
                      ) -> None:
        if not rows:
            return
        if guard:
            self.fence.write(guard, "hset", {f"{lane}|{seq}": value
                                             for (lane, seq), value in rows.items()},
                             hash_key=self._outbox)
        else:
            self._acks.execute(self._client, lambda pipe: pipe.hset(
                self._outbox, mapping={f"{lane}|{seq}": value
                                       for (lane, seq), value in rows.items()}))

    def outbox_remove(self, keys: Sequence[OutboxKey]) -> None:
        if keys:
            self._client.hdel(self._outbox, *(f"{lane}|{seq}" for lane, seq in keys))

    def outbox_load(self) -> dict[str, list[tuple[int, bytes]]]:
        """Read with HSCAN, so a large outbox never blocks Redis for one long HGETALL.

        HSCAN may return a field twice; the dict keeps it once.
        """
        fields = dict(self._client.hscan_iter(self._outbox, count=1000))
        lanes: dict[str, list[tuple[int, bytes]]] = {}
        for field, value in fields.items():
            lane, seq = cast(bytes, field).decode().rsplit("|", 1)
            lanes.setdefault(lane, []).append((int(seq), cast(bytes, value)))
        for records in lanes.values():
            records.sort(key=lambda record: record[0])
        return lanes

    def add_stats(self, counters: Mapping[str, int]) -> None:
        nonzero = {k: v for k, v in counters.items() if v}
        if not nonzero:
            return
        pipe = self._client.pipeline(transaction=False)
        for field, amount in nonzero.items():
            pipe.hincrby(f"{self._base}:stats", field, amount)
        pipe.execute()

    def read_stats(self) -> dict[str, int]:
        raw = cast(dict[bytes, Any], self._client.hgetall(f"{self._base}:stats"))
        return {k.decode(): int(v) for k, v in raw.items()}

    def check_access(self) -> Exception | None:
        """PING (after AUTH and the TLS handshake); the error if Redis did not answer."""
        try:
            self._client.ping()
        except redis.RedisError as error:
            denied = access_denied(error)
            if denied is not None:
                raise denied from error
            return error
        return None

    def durability(self) -> tuple[int, str]:
        """What Redis keeps of an acknowledged write (``redis_durability.persistence_report``)."""
        return persistence_report(self._client, self._where, self._acks.replicas)

    def close(self) -> None:
        self._client.close()
