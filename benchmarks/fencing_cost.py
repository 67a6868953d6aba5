"""What fencing costs a snapshot write: guarded against unguarded, on Redis or Cassandra.

Starts its own Redis (fsync-always AOF, as the tests' and the demo's) or, with
``--store cassandra``, its own Cassandra 2.1 (batch commitlog), then writes
snapshots of ``--rows`` states (each about the size of a robot's encoded
state, 91 bytes) ``--repeat`` times each way, with a guard of ``--partitions``
epochs, and prints the median time per snapshot and per row, and of a take.
On Redis the guarded write is the Lua script against a plain MSET; on
Cassandra the epochs' read before the same timestamped INSERTs. A few seconds
(Cassandra: a minute to start); the store and the client share the machine.

    python benchmarks/fencing_cost.py [--store redis|cassandra] [--rows 1000 10000]
        [--partitions 4] [--repeat 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from onceflow.devtools import services
from onceflow.devtools.services import ServiceInfo
from onceflow.stores.base import StateStore
from onceflow.stores.redis_store import RedisStore

STATE = b'{"v":{"ok":1234,"failed":56},"w":{"robot-reports|3":[123456789]},"h":"r|3"}'



def median_seconds(write: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        write()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--store", choices=["redis", "cassandra"], default="redis")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        start = services.start_redis if args.store == "redis" else services.start_cassandra
        info = start(Path(state))
        try:
            store = open_store(args.store, info)
            partitions = [("robot-reports", p) for p in range(args.partitions)]
            take = median_seconds(partial(store.take_epochs, partitions), args.repeat)
            guard = store.take_epochs(partitions).guard
            print(f"take of {args.partitions} epochs: {take * 1e3:.2f} ms")
            print(f"{'rows':>7} {'plain ms':>9} {'guarded ms':>11} {'extra ms':>9} "
                  f"{'extra us/row':>13}")
            for n in args.rows:
                rows = {f"robot-{i:06d}": STATE for i in range(n)}
                plain = median_seconds(partial(store.save, "per_robot", rows), args.repeat)
                fenced = median_seconds(partial(store.save, "per_robot", rows, guard=guard),
                                        args.repeat)
                print(f"{n:>7} {plain * 1e3:>9.2f} {fenced * 1e3:>11.2f} "
                      f"{(fenced - plain) * 1e3:>9.2f} {(fenced - plain) / n * 1e6:>13.2f}")
            store.close()
        finally:
            services.stop(info)


def open_store(kind: str, info: ServiceInfo) -> StateStore:
    if kind == "redis":
        return RedisStore(f"redis://{info.address}/0", "bench", "fencing")
    from onceflow.stores.cassandra_store import CassandraStore

    return CassandraStore([info.host], "fencing", port=info.port, keyspace="bench",
                          protocol_version=3)


if __name__ == "__main__":
    main()
