"""The produce gate's check without a store read: a send's input partitions must still be
held while its records wait, for a produce request and for an outbox row alike."""

from __future__ import annotations

from typing import Any, cast

import pytest

from onceflow.kafka.produce_gate import ProduceGate
from onceflow.stores.base import StateStore
from onceflow.stores.fencing import Fenced, Taken
from onceflow.stores.fencing.held_epochs import EpochFence, OutputFence

IN0, IN1 = ("in", 0), ("in", 1)


def gate_over(fence: EpochFence, failures: list[BaseException]) -> ProduceGate:
    no_store = cast(StateStore, None)  # the local check reads no store
    return ProduceGate(OutputFence(no_store, fence, frozenset()),
                       lambda name, error: failures.append(error), "ProducerActor")


def test_an_outbox_row_of_a_send_whose_partition_was_revoked_is_refused() -> None:
    fence, failures = EpochFence(), []
    fence.assign(Taken(3, {IN0: None, IN1: None}))
    gate = gate_over(fence, failures)
    guard = gate.outbox_guard(fence.held)
    assert guard() == {IN0: 3, IN1: 3}
    with gate.sending(frozenset({IN0})):
        fence.drop({IN1})  # another partition's revoke: this send is not concerned
        assert guard() == {IN0: 3}
        fence.drop({IN0})  # its own, unflushed (a zombie thawed): no epoch left to guard it
        with pytest.raises(Fenced, match=r"in\[0\]: this worker holds no epoch"):
            guard()
    assert guard() == {}  # settled: nothing of it waits, the outbox has nothing to guard


def test_sends_count_their_partitions_until_each_is_settled() -> None:
    fence, failures = EpochFence(), []
    fence.assign(Taken(1, {IN0: None}))
    gate = gate_over(fence, failures)
    state: Any = gate
    with gate.sending(frozenset({IN0})), gate.sending(frozenset({IN0, IN1})):
        assert state._unsettled == {IN0: 2, IN1: 1}
        with pytest.raises(Fenced):  # in[1] was never held here
            gate.outbox_guard(fence.held)()
    assert state._unsettled == {}
    with pytest.raises(RuntimeError), gate.sending(frozenset({IN1})):  # a failed send
        raise RuntimeError("not delivered")
    assert state._unsettled == {}
