"""``stores.retry.retrying``: transient store errors are retried, others are not, and the
call is not kept alive afterwards (a cycle did, and worker memory grew per snapshot)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from onceflow.stores.retry import retrying


class Rows:
    """Stands for a snapshot's rows."""


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_the_call_and_what_it_holds_are_freed_when_it_returns(no_cyclic_gc: None) -> None:
    def write() -> weakref.ref[Rows]:
        rows = Rows()
        assert retrying("save", lambda: (rows, 7)[1]) == 7
        return weakref.ref(rows)

    assert write()() is None  # freed by reference counting, no cyclic GC needed


def test_a_transient_error_is_retried_until_the_call_succeeds() -> None:
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("store down")
        return "written"

    assert retrying("save", flaky) == "written"
    assert len(attempts) == 3


def test_a_non_transient_error_is_raised_at_once() -> None:
    attempts = []

    def broken() -> None:
        attempts.append(1)
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        retrying("save", broken)
    assert len(attempts) == 1


def test_a_store_that_stays_down_is_given_up_after_the_limit() -> None:
    with pytest.raises(TimeoutError):
        retrying("save", lambda: (_ for _ in ()).throw(TimeoutError("down")), give_up_after=0.3)
