"""Supervisor policies, backoff, budget and the child state machine (no network)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pykka
import pytest

from onceflow.actors.base import FatalHandler
from onceflow.actors.supervisor import (
    ChildSpec,
    ChildState,
    Policy,
    RestartLoop,
    RestartSettings,
    Supervisor,
    _Slot,
)


class Fake:
    """A child kind: counts starts and stops, and can be made to fail."""

    def __init__(self, name: str):
        self.name = name
        self.starts: list[float] = []
        self.stops = 0
        self.report: FatalHandler | None = None

    def start(self, report: FatalHandler) -> Fake:
        self.starts.append(time.monotonic())
        self.report = report
        return self

    def stop(self) -> None:
        self.stops += 1

    def fail(self) -> None:
        assert self.report is not None
        self.report(self.name, RuntimeError(f"{self.name} broke"))


@pytest.fixture(autouse=True)
def _stop_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


def fast(policy: Policy, max_restarts: int = 5, initial: float = 0.01, within: float = 60
         ) -> RestartSettings:
    """Short backoffs without jitter, so restarts happen promptly and in a known order."""
    return RestartSettings(policy=policy, max_restarts=max_restarts, within=within,
                           backoff_initial=initial, backoff_max=1.0, backoff_jitter=0)


def supervise(policy: Policy, max_restarts: int = 5, initial: float = 0.01, within: float = 60
              ) -> tuple[pykka.ActorProxy[Supervisor], dict[str, Fake], list[str]]:
    fakes = {name: Fake(name) for name in ("a", "b", "c")}
    escalated: list[str] = []
    settings = fast(policy, max_restarts, initial, within)
    ref = Supervisor.start([ChildSpec(n, f.start) for n, f in fakes.items()], settings,
                           lambda name, error: escalated.append(name))
    return ref.proxy(), fakes, escalated


def wait_until(check: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.parametrize(("policy", "restarted"), [
    (Policy.ONE_FOR_ONE, {"b"}),
    (Policy.ONE_FOR_ALL, {"a", "b", "c"}),
    (Policy.REST_FOR_ONE, {"b", "c"}),
])
def test_policy_decides_which_children_restart(policy: Policy, restarted: set[str]) -> None:
    sup, fakes, _ = supervise(policy)
    wait_until(lambda: all(s == ChildState.RUNNING for s in sup.states().get().values()))
    fakes["b"].fail()
    wait_until(lambda: sum(sup.restarts().get().values()) == len(restarted)
               and all(s == ChildState.RUNNING for s in sup.states().get().values()))
    assert {n for n, f in fakes.items() if len(f.starts) == 2} == restarted
    assert {n for n, f in fakes.items() if f.stops == 1} == restarted


@pytest.mark.parametrize(("policy", "failing", "restarted"), [
    (Policy.ONE_FOR_ONE, "a", {"a", "c"}),  # c depends on a
    (Policy.ONE_FOR_ONE, "b", {"b"}),
    (Policy.ONE_FOR_ONE, "c", {"c"}),
    (Policy.REST_FOR_ONE, "a", {"a", "b", "c"}),
])
def test_a_child_never_outlives_one_it_depends_on(policy: Policy, failing: str,
                                                  restarted: set[str]) -> None:
    fakes = {name: Fake(name) for name in ("a", "b", "c")}
    settings = fast(policy)
    specs = [ChildSpec("a", fakes["a"].start), ChildSpec("b", fakes["b"].start),
             ChildSpec("c", fakes["c"].start, depends_on=("a",))]
    sup = Supervisor.start(specs, settings, lambda name, error: None).proxy()
    wait_until(lambda: all(s == ChildState.RUNNING for s in sup.states().get().values()))
    fakes[failing].fail()
    wait_until(lambda: sum(sup.restarts().get().values()) == len(restarted)
               and all(s == ChildState.RUNNING for s in sup.states().get().values()))
    assert {n for n, f in fakes.items() if len(f.starts) == 2} == restarted


def test_a_dependency_must_be_declared_before_its_dependent() -> None:
    with pytest.raises(ValueError, match="depends on"):
        Supervisor(
            [ChildSpec("a", Fake("a").start, depends_on=("b",)), ChildSpec("b", Fake("b").start)],
            fast(Policy.REST_FOR_ONE), lambda name, error: None)


def test_restart_delays_grow() -> None:
    sup, fakes, _ = supervise(Policy.ONE_FOR_ONE, max_restarts=10, initial=0.05)
    a = fakes["a"]
    for n in range(1, 5):
        wait_until(lambda n=n: len(a.starts) == n and sup.states().get()["a"] == "running")
        failed_at = time.monotonic()
        a.fail()
        wait_until(lambda n=n: len(a.starts) == n + 1)
        a.starts[-1] -= failed_at  # keep only the delay
    delays = a.starts[1:]
    assert delays == sorted(delays) and delays[-1] > 3 * delays[0], delays


def test_the_backoff_starts_over_after_a_healthy_window() -> None:
    sup, fakes, _ = supervise(Policy.ONE_FOR_ONE, max_restarts=10, initial=0.2, within=3.0)
    a = fakes["a"]

    def fail_and_time_the_restart() -> float:
        n = len(a.starts)
        wait_until(lambda: sup.states().get()["a"] == "running")
        failed_at = time.monotonic()
        a.fail()
        wait_until(lambda: len(a.starts) == n + 1)
        return a.starts[-1] - failed_at

    growing = [fail_and_time_the_restart() for _ in range(3)]  # about 0.2, 0.4, 0.8 s
    assert growing[2] > 3 * growing[0], growing
    time.sleep(3.2)  # healthy for longer than `within`
    again = fail_and_time_the_restart()
    assert again < growing[1], (growing, again)


def test_budget_exhausted_escalates_and_fails_every_child() -> None:
    sup, fakes, escalated = supervise(Policy.ONE_FOR_ALL, max_restarts=2)
    for n in range(1, 4):
        wait_until(lambda n=n: len(fakes["a"].starts) == n
                   and sup.states().get()["a"] == "running")
        fakes["a"].fail()
    wait_until(lambda: escalated == ["a"])
    assert set(sup.states().get().values()) == {ChildState.FAILED}
    assert len(fakes["a"].starts) == 3  # the first start and two restarts, no more


def test_a_stale_failure_from_a_replaced_instance_is_ignored() -> None:
    sup, fakes, _ = supervise(Policy.ONE_FOR_ONE)
    wait_until(lambda: sup.states().get()["a"] == "running")
    old_report = fakes["a"].report
    fakes["a"].fail()
    wait_until(lambda: len(fakes["a"].starts) == 2 and sup.states().get()["a"] == "running")
    assert old_report is not None
    old_report("a", RuntimeError("late news from the old instance"))
    time.sleep(0.2)
    assert len(fakes["a"].starts) == 2


def test_state_machine_refuses_undeclared_transitions() -> None:
    slot = _Slot(ChildSpec("x", Fake("x").start))
    with pytest.raises(RuntimeError):
        slot.move(ChildState.RUNNING)  # must start first
    slot.move(ChildState.STARTING)
    slot.move(ChildState.RUNNING)
    slot.move(ChildState.STOPPED)
    with pytest.raises(RuntimeError):
        slot.move(ChildState.STARTING)  # stopped is final


def test_stop_children_stops_everything_once() -> None:
    sup, fakes, _ = supervise(Policy.ONE_FOR_ALL)
    wait_until(lambda: all(s == "running" for s in sup.states().get().values()))
    sup.stop_children().get()
    assert [f.stops for f in fakes.values()] == [1, 1, 1]
    assert set(sup.states().get().values()) == {ChildState.STOPPED}


def repeating(max_repeats: int, progress: Callable[[], int]
              ) -> tuple[pykka.ActorProxy[Supervisor], Fake, list[BaseException]]:
    """One child under a budget that never runs out (a slow backoff's loop, sped up)."""
    fake = Fake("a")
    escalated: list[BaseException] = []
    settings = RestartSettings(Policy.ONE_FOR_ONE, max_restarts=1000, within=60,
                               backoff_initial=0.01, backoff_max=0.01, backoff_jitter=0,
                               max_repeats=max_repeats)
    ref = Supervisor.start([ChildSpec("a", fake.start)], settings,
                           lambda name, error: escalated.append(error), progress=progress)
    return ref.proxy(), fake, escalated


def fail_running(sup: pykka.ActorProxy[Supervisor], fake: Fake, times: int) -> None:
    for _ in range(times):
        n = len(fake.starts)
        wait_until(lambda: sup.states().get()["a"] == "running")
        fake.fail()
        wait_until(lambda n=n: len(fake.starts) == n + 1 or sup.states().get()["a"] == "failed")


def test_the_same_failure_with_no_progress_escalates_whatever_the_budget() -> None:
    sup, fake, escalated = repeating(4, lambda: 0)
    fail_running(sup, fake, 3)
    assert escalated == [] and sup.looping().get()["repeats"] == 3
    fail_running(sup, fake, 1)
    wait_until(lambda: sup.states().get()["a"] == "failed")
    assert [type(e) for e in escalated] == [RestartLoop]
    assert "failed 4 times in a row" in str(escalated[0]) and "a broke" in str(escalated[0])


def test_progress_between_failures_starts_the_count_over() -> None:
    commits = [0]
    sup, fake, escalated = repeating(3, lambda: commits[0])
    for _ in range(6):  # a commit between every two failures: not a loop in one place
        fail_running(sup, fake, 1)
        commits[0] += 1
    assert escalated == [] and sup.states().get()["a"] == "running"
    assert sup.looping().get() is None


def test_a_different_failure_starts_the_count_over() -> None:
    sup, fake, escalated = repeating(3, lambda: 0)
    for i in range(6):
        wait_until(lambda: sup.states().get()["a"] == "running")
        n = len(fake.starts)
        assert fake.report is not None
        fake.report("a", RuntimeError(f"broke {i % 2}"))
        wait_until(lambda n=n: len(fake.starts) == n + 1)
    assert escalated == []


def test_a_child_that_ran_a_whole_window_before_failing_again_is_not_looping() -> None:
    fake = Fake("a")
    escalated: list[BaseException] = []
    settings = RestartSettings(Policy.ONE_FOR_ONE, max_restarts=1000, within=0.3,
                               backoff_initial=0.01, backoff_max=0.01, backoff_jitter=0,
                               max_repeats=2)
    sup = Supervisor.start([ChildSpec("a", fake.start)], settings,
                           lambda name, error: escalated.append(error)).proxy()
    for _ in range(4):  # the same failure, but each after a healthy window (quiet topic)
        wait_until(lambda: sup.states().get()["a"] == "running")
        time.sleep(0.4)
        n = len(fake.starts)
        fake.fail()
        wait_until(lambda n=n: len(fake.starts) == n + 1)
    assert escalated == []
