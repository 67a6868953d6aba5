"""The check before exclusive outputs (``OutputFence``) against a real Redis: it passes
while this worker holds the epochs, and refuses once another worker took one over."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from onceflow.devtools.services import ServiceInfo
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
