"""The check before outputs are produced (``OutputFence``, ``kafka.produce_gate``) against
a real Redis and broker: it passes while this worker holds the epochs, and refuses once
another worker took one over, or once a send's input partition was revoked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from helpers import create_topic

from onceflow.actors.loop import EventLoopThread
from onceflow.devtools import harness
from onceflow.devtools.services import ServiceInfo
from onceflow.kafka.delivery import DeliverySettings, OutboxTally
from onceflow.kafka.producer import ProducerActor
from onceflow.stages.outcome import Output
from onceflow.stores.fencing import Fenced
from onceflow.stores.fencing.held_epochs import EpochFence, OutputFence
from onceflow.stores.redis_store import RedisStore


def test_the_output_check_refuses_a_worker_whose_partition_was_taken_over(
    redis_service: ServiceInfo, unique_name: Callable[..., str],
) -> None:
    url, prefix = f"redis://{redis_service.address}/0", unique_name("p")
    ours, successor = RedisStore(url, prefix, "pipe"), RedisStore(url, prefix, "pipe")
    try:
        inputs = [("in", 0), ("in", 1)]
        fence = EpochFence()
        fence.assign(ours.take_epochs(inputs))
        check = OutputFence(ours, fence, frozenset({"pristine", "late"}))
        assert check.wanted([Output("plain", None, b"x"), Output("late", None, b"y")])
        assert not check.wanted([Output("plain", None, b"x")])  # plain outputs: no read
        assert check.check({("in", 0)}) == {("in", 0): fence.held()[("in", 0)]}
        successor.take_epochs([("in", 1)])  # a rebalance without us: in[1] is theirs now
        assert check.check({("in", 0)})  # what depends on in[0] alone still passes
        with pytest.raises(Fenced, match=r"in\[1\]: this worker holds epoch 1, the store has 2"):
            check.check({("in", 0), ("in", 1)})
    finally:
        ours.close()
        successor.close()


def test_a_send_whose_input_partition_was_revoked_unflushed_is_never_produced(
    kafka_service: ServiceInfo, redis_service: ServiceInfo, unique_name: Callable[..., str],
) -> None:
    """A zombie thawed: its session expired, so the revoke's flush fails (its pipeline actor
    is down) and the revoke drops the partitions from the fence, while a send handed over
    before is still in the lanes. With no epoch held, the check of the epochs held *now*
    passed with nothing to check, and the send went out after the successor's (a join's
    run that only the zombie applied: payments with two categories). The gate checks the
    unsettled sends' own input partitions: the request is refused, nothing is written."""
    url, prefix, topic = f"redis://{redis_service.address}/0", unique_name("p"), \
        unique_name("out")
    create_topic(kafka_service.address, topic, 1)
    ours, successor = RedisStore(url, prefix, "pipe"), RedisStore(url, prefix, "pipe")
    fence, tp, failures = EpochFence(), ("in", 0), []
    io = EventLoopThread("test-producer")
    producer = ProducerActor(
        options={"bootstrap_servers": kafka_service.address, "acks": "all",
                 "enable_idempotence": False},
        delivery=DeliverySettings(delivery_timeout=30, request_timeout=10, retries=3,
                                  retry_backoff=0.1, reconnect_backoff=0.05,
                                  reconnect_backoff_max=1),
        max_block=10, outbox=None, tally=OutboxTally(),
        output_fence=OutputFence(ours, fence, frozenset()), io=io, start_timeout=30,
        on_fatal=lambda name, error: failures.append(error))

    async def revoked_while_sending() -> BaseException | None:
        sending = asyncio.ensure_future(producer.send([Output(topic, None, b"late")],
                                                      frozenset({tp})))
        await asyncio.sleep(0)  # handed over: in the lanes, no request written yet
        successor.take_epochs([tp])  # the successor's assignment (a blocking call: fine)
        fence.drop({tp})  # the zombie's revoke, its flush failed
        try:
            await sending
        except BaseException as error:
            return error
        return None

    try:
        fence.assign(ours.take_epochs([tp]))
        producer.start()
        io.run(producer.send([Output(topic, None, b"held")], frozenset({tp})), timeout=30)
        error = io.run(revoked_while_sending(), timeout=30)
        assert "FencedProduce('write fenced: in[0]" in repr(error), error  # the lane's failure
        assert any(isinstance(f, Fenced) for f in failures), failures
        written = asyncio.run(harness.read_all(kafka_service.address, topic, 1, quiet=1.0))
        assert [r.value for r in written] == [b"held"]
    finally:
        producer.stop()
        io.stop()
        ours.close()
        successor.close()
