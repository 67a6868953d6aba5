"""The producer side of a republisher per output record, in process, without a broker.

``ProducerActor._send`` (the worker's own: partitioner, per-partition lanes,
aiokafka batch building, settling) over the chaos republisher's real
outputs (``runner_cost.py --pipeline normalize``: ~3 envelopes per robot
report), in ``Send``s of one 2,000-report batch each; the broker is replaced
by an answer that arrives at once, so what is left is the Python cost on the
producer's event loop (in a worker, a thread beside the pipeline's, sharing
its GIL).

    python benchmarks/producer_cost.py [--messages 100000] [--repeat 5] [--units]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from runner_cost import BATCH, records

from onceflow.examples.robot_chain import build_normalize
from onceflow.kafka.delivery import DeliverySettings, Lanes, OutboxTally
from onceflow.kafka.producer import ProducerActor
from onceflow.stages.outcome import Output
from onceflow.stages.runner import PipelineRunner

SETTINGS = DeliverySettings(delivery_timeout=60, request_timeout=30, retries=0,
                            retry_backoff=0.1, reconnect_backoff=0.05, reconnect_backoff_max=1)


async def one_pass(sends: Sequence[Sequence[Output]]) -> float:
    """Seconds to hand every send to the lanes and see all of it acknowledged."""
    actor = ProducerActor(options={}, delivery=SETTINGS, max_block=5.0, outbox=None,
                         tally=OutboxTally(), io=None,  # type: ignore[arg-type]
                         start_timeout=5.0, on_fatal=lambda name, error: None)
    actor._opened.set()
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", linger_ms=5,
                                max_batch_size=1048576)
    loop = asyncio.get_running_loop()

    async def acked(batch: Any, topic: str, partition: int) -> asyncio.Future[None]:
        batch.close()
        done: asyncio.Future[None] = loop.create_future()
        done.set_result(None)
        return done

    producer.send_batch = acked  # type: ignore[method-assign]
    actor._producer = producer
    actor._order = asyncio.Lock()
    actor._lanes = Lanes(actor._send_batch, SETTINGS, None)
    actor._partitions = {sends[0][0].topic: [0, 1, 2, 3]}
    start = time.perf_counter()
    for outputs in sends:
        await actor._send(outputs)
    elapsed = time.perf_counter() - start
    for task in actor._lanes.tasks():
        task.cancel()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--units", action="store_true",
                        help="the outputs as units (one record per report), as the chain now")
    args = parser.parse_args()
    reports = records(args.messages, "normalize")
    runner = PipelineRunner(build_normalize("reports", "normalized", unit=args.units),
                            lambda spec, keys: {}, "dead", load_sequences=lambda keys: {})
    sends = [runner.process(reports[i:i + BATCH]).outputs
             for i in range(0, len(reports), BATCH)]
    outputs = sum(map(len, sends))
    best = min(asyncio.run(one_pass(sends)) for _ in range(args.repeat))
    print(f"producer: {outputs:,} outputs of {len(reports):,} reports in {len(sends)} sends, "
          f"best of {args.repeat}: {best / outputs * 1e6:.2f} us/output, "
          f"{best / len(reports) * 1e6:.2f} us/report")


if __name__ == "__main__":
    main()
