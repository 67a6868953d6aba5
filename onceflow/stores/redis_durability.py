"""Whether Redis keeps a write it acknowledged: replicas that must hold it, the AOF it has.

Offsets are committed only after the states holding them are written
(docs/architecture.md, invariant 5); that keeps every event counted only if
the store does not lose a write it acknowledged. Redis loses one in a crash of
its machine unless its append-only file is fsynced per write (``appendfsync always``), and
in a failover to a replica that had not received it. Two answers:

- ``ReplicaWait``: a write counts once ``wait-replicas`` replicas acknowledged
  it, by ``WAIT`` on the write's own connection (one pipeline: WAIT counts the
  writes of its connection only). Fewer within the timeout raises
  ``ReplicasBehind``, a ``TimeoutError``: the store's callers retry it with
  backoff (``onceflow.stores.retry``) and hold the commit meanwhile.
- ``persistence_report``: what ``CONFIG GET appendonly appendfsync`` says, and a
  warning when an acknowledged write can be lost; a Redis that refuses CONFIG
  (managed services often do) is reported as not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import redis
from redis.client import Pipeline

__all__ = ["ReplicaWait", "ReplicasBehind", "persistence_report"]

WAIT_KEY = "onceflow.stores.redis.wait-replicas"
_GUIDE = "docs/guide/guarantees.md, Store durability"


class ReplicasBehind(TimeoutError):
    """Fewer replicas than ``wait-replicas`` acknowledged a write in time: not yet written.

    The write did reach the primary; written again, it is the same value.
    """


class ReplicaWait:
    """``WAIT replicas timeout`` after each write, on its connection; 0 replicas: none."""

    def __init__(self, replicas: int = 0, timeout: float = 1.0):
        self.replicas = replicas
        self.timeout = timeout

    def execute(self, client: redis.Redis, write: Callable[[Pipeline], object]) -> list[Any]:
        """The answers of the commands ``write`` queues on one pipeline, once acknowledged;
        ``ReplicasBehind`` when too few replicas acknowledged them."""
        pipe = client.pipeline(transaction=False)
        write(pipe)
        if not self.replicas:
            return pipe.execute()
        pipe.wait(self.replicas, max(1, round(self.timeout * 1000)))
        *answers, acknowledged = pipe.execute()
        if int(acknowledged) < self.replicas:
            raise ReplicasBehind(
                f"redis: {acknowledged} of {self.replicas} replicas acknowledged a write "
                f"within {self.timeout:g}s ({WAIT_KEY}): not counted as written")
        return answers


def persistence_report(client: redis.Redis, where: str, wait_replicas: int
                       ) -> tuple[int, str]:
    """(logging level, message) on what Redis at ``where`` keeps of an acknowledged write."""
    try:
        found = {name: _config(client, name) for name in ("appendonly", "appendfsync")}
    except redis.RedisError as error:  # CONFIG renamed, disabled or denied to the ACL user
        level = logging.INFO if wait_replicas else logging.WARNING
        return level, (f"redis at {where}: could not check its persistence (CONFIG GET "
                       f"refused: {error}); {_rule(wait_replicas)}")
    settings = f"appendonly {found['appendonly']}, appendfsync {found['appendfsync']}"
    if found["appendonly"] == "yes" and found["appendfsync"] == "always":
        return logging.INFO, (f"redis at {where}: {settings}: an acknowledged write "
                              "survives a crash")
    if wait_replicas:
        return logging.INFO, (f"redis at {where}: {settings}; each write waits for "
                              f"{wait_replicas} replica(s) ({WAIT_KEY})")
    lost = ("no append-only file" if found["appendonly"] != "yes"
            else f"appendfsync {found['appendfsync']}")
    return logging.WARNING, (
        f"redis at {where}: {settings}: with {lost} a crash of its machine can lose "
        "writes it acknowledged, after their offsets were committed (events lost); set "
        f"appendfsync always (with appendonly yes), or {WAIT_KEY} ({_GUIDE})")


def _config(client: redis.Redis, name: str) -> str:
    """One setting's value from CONFIG GET; a Redis that answers nothing refused it."""
    answer = cast(dict[Any, Any], client.config_get(name))
    value = answer.get(name, answer.get(name.encode()))
    if value is None:
        raise redis.ResponseError(f"CONFIG GET {name} answered nothing")
    return value.decode() if isinstance(value, bytes) else str(value)


def _rule(wait_replicas: int) -> str:
    if wait_replicas:
        return f"each write waits for {wait_replicas} replica(s) ({WAIT_KEY})"
    return (f"an acknowledged write is kept only with appendonly yes and appendfsync always, "
            f"or with {WAIT_KEY} ({_GUIDE})")
