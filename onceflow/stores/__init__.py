"""onceflow.stores: where aggregate states live, behind one interface.

- :mod:`onceflow.stores.base`: :class:`~onceflow.stores.base.StateStore`, opaque
  bytes per (stage, key) of one pipeline.
- :mod:`onceflow.stores.redis_store`: one Redis string per state (``redis``).
- :mod:`onceflow.stores.cassandra_store`: one Cassandra row per state
  (``cassandra``); its tables in :mod:`onceflow.stores.cassandra_schema`.
- :mod:`onceflow.stores.access`: logins and TLS, and refusals (never retried).
- :mod:`onceflow.stores.retry`: the store callers' retry with backoff.
- :mod:`onceflow.stores.fencing`: epochs and guarded writes, with each backend's
  (``redis_fence``, ``cassandra_fence``) and the epochs a worker holds (``held_epochs``).

An aggregate names its store (``Pipeline.aggregate(..., store="cassandra")``).
Nothing is imported here, so a Redis-only worker never loads the Cassandra driver.
"""
