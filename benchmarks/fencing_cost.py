"""What fencing costs a snapshot write: guarded against unguarded, on Redis or Cassandra.

Starts its own Redis (fsync-always AOF, as the tests' and the demo's) or, with
``--store cassandra``, its own Cassandra 2.1 (batch commitlog), then writes
snapshots of ``--rows`` states (each about the size of a robot's encoded
state, 91 bytes) ``--repeat`` times each way, with a guard of ``--partitions``
epochs, and prints the median time per snapshot and per row, and of a take.
On Redis the guarded write is the Lua script against a plain MSET; on
Cassandra the epochs' read before the same timestamped INSERTs. A few seconds
(Cassandra: a minute to start); the store and the client share the machine.

``--outputs``: the check before exclusive outputs instead. A Tansu broker and
Redis are started; the worker's ``ProducerActor`` produces ``--messages``
exclusive outputs (80-byte records, ``--batch`` per ``Send``, spread over 4
partitions as a worker's batches are) and waits for their acks, alternately
with the check (``OutputFence``: one ``check_epochs`` read per ``Send``) and
without it, ``--repeat`` times each; it prints the median rate of each and their
ratio, and the check's median round trip.

    python benchmarks/fencing_cost.py [--store redis|cassandra] [--rows 1000 10000]
        [--partitions 4] [--repeat 30]
    python benchmarks/fencing_cost.py --outputs [--messages 100000] [--batch 100 500]
        [--repeat 5]
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
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--store", choices=["redis", "cassandra"], default="redis")
    parser.add_argument("--outputs", action="store_true",
                        help="the check before exclusive outputs, with against without")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[100, 500])
    args = parser.parse_args()
    if args.outputs:
        outputs_cost(args.messages, args.batch, args.repeat or 5)
        return
    args.repeat = args.repeat or 30
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


def outputs_cost(messages: int, batches: list[int], repeat: int) -> None:
    """Exclusive outputs through the ProducerActor, with the fence check and without."""
    import asyncio

    from onceflow.actors.loop import EventLoopThread
    from onceflow.actors.messages import Send
    from onceflow.devtools import harness
    from onceflow.kafka.delivery import DeliverySettings, OutboxTally
    from onceflow.kafka.producer import ProducerActor
    from onceflow.stages.outcome import Output
    from onceflow.stores.fencing.held_epochs import EpochFence, OutputFence

    topic, inputs = "bench-exclusive", [("bench-in", p) for p in range(4)]
    settings = DeliverySettings(delivery_timeout=120, request_timeout=30, retries=2**31 - 1,
                                retry_backoff=0.1, reconnect_backoff=0.05,
                                reconnect_backoff_max=1)
    with tempfile.TemporaryDirectory() as state:
        kafka = services.start_tansu(Path(state) / "kafka")
        redis_info = services.start_redis(Path(state) / "redis")
        store = RedisStore(f"redis://{redis_info.address}/0", "bench", "outputs")
        io = EventLoopThread()
        try:
            asyncio.run(harness.create_topic(kafka.address, topic, 4))
            fence = EpochFence()
            fence.assign(store.take_epochs(inputs))
            check = median_seconds(partial(store.check_epochs, fence.held()), 200)
            print(f"check of 1 epoch (the store's round trip): {check * 1e3:.3f} ms")
            print(f"{'batch':>6} {'without rec/s':>14} {'with rec/s':>11} {'ratio':>6}")

            def run(batch: int, checked: bool) -> float:
                producer = ProducerActor(
                    options={"bootstrap_servers": kafka.address, "acks": "all",
                             "enable_idempotence": False, "linger_ms": 5},
                    delivery=settings, max_block=60, outbox=None, tally=OutboxTally(),
                    output_fence=OutputFence(store, fence, frozenset({topic})) if checked
                    else None, io=io, start_timeout=60, on_fatal=lambda who, error: None)
                producer.start()
                try:
                    started = time.perf_counter()
                    sent = []
                    for number, first in enumerate(range(0, messages, batch), 1):
                        p = number % 4
                        outputs = [Output(topic, None, STATE, (), p)
                                   for _ in range(min(batch, messages - first))]
                        producer.check(Send(outputs, number, frozenset({inputs[p]})))
                        sent.append(io.submit(producer.send(outputs)))
                    for settled in sent:
                        settled.result()
                    return messages / (time.perf_counter() - started)
                finally:
                    producer.stop()

            for batch in batches:
                rates: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(repeat):
                    for checked in (False, True):
                        rates[checked].append(run(batch, checked))
                without, with_ = (statistics.median(rates[c]) for c in (False, True))
                print(f"{batch:>6} {without:>14,.0f} {with_:>11,.0f} {with_ / without:>6.3f}")
        finally:
            io.stop()
            store.close()
            services.stop(redis_info)
            services.stop(kafka)


def open_store(kind: str, info: ServiceInfo) -> StateStore:
    if kind == "redis":
        return RedisStore(f"redis://{info.address}/0", "bench", "fencing")
    from onceflow.stores.cassandra_store import CassandraStore

    return CassandraStore([info.host], "fencing", port=info.port, keyspace="bench",
                          protocol_version=3)


if __name__ == "__main__":
    main()
