"""What fencing costs a snapshot write on Redis: the guarded Lua write against plain MSET.

Starts its own Redis (fsync-always AOF, as the tests' and the demo's), then
writes snapshots of ``--rows`` states (each about the size of a robot's
encoded state, 91 bytes) ``--repeat`` times each way, with a guard of
``--partitions`` epochs, and prints the median time per snapshot and per row.
A few seconds; Redis and the client share the machine.

    python benchmarks/fencing_cost.py [--rows 1000 10000] [--partitions 4] [--repeat 30]
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        info = services.start_redis(Path(state))
        try:
            store = RedisStore(f"redis://{info.address}/0", "bench", "fencing")
            guard = store.take_epochs([("robot-reports", p) for p in range(args.partitions)]).guard
            print(f"{'rows':>7} {'MSET ms':>9} {'guarded ms':>11} {'extra ms':>9} "
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


if __name__ == "__main__":
    main()
