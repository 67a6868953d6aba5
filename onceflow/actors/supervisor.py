"""Supervisor: restart policies, a restart budget and backoff, on top of pykka.

pykka has no supervision, so children report failures to the supervisor
(through the ``on_fatal`` handler they are started with), and the
supervisor restarts them by policy. Children are declared in start order,
each naming the children it depends on (``depends_on``); a child never
outlives one it depends on, whatever the policy:

- ``one_for_one``: the failed child and those that depend on it;
- ``rest_for_one``: the failed child and those started after it (the
  worker's default: a consumer stream fails alone, the core takes the
  stream with it);
- ``one_for_all``: every child.

Restarts wait an exponential backoff with jitter (tenacity); more than
``max_restarts`` within ``within`` seconds exhausts the budget and the
supervisor escalates: every child is stopped and ``on_escalate`` is called.
A failure ``permanent`` says no restart can fix (a store refusing the
password) escalates at once.

A restart loop that makes no progress escalates too, whatever the backoff
(which can keep failures under ``max_restarts`` per ``within`` for ever):
the same failure ``max_repeats`` times in a row escalates with
``RestartLoop``. The same failure is the same child failing with the same
exception type and message, with no progress in between (``progress``: a
counter the owner bumps on progress; the worker counts its commits), the
child having failed within ``within`` of its start. A deterministic failure
(a poisoned record, a bug) repeats exactly, soon after each start, and
nothing is committed past it; a different failure, a commit between two, or
an incarnation that ran a whole ``within`` (an outage now and then on a
quiet topic, where nothing is there to commit) means the loop is not stuck
in one place, and the budget decides.

Each child moves through an explicit state machine (``TRANSITIONS``):

    (new) -> STARTING -> RUNNING -> BACKING_OFF -> STARTING -> ...
    any live state -> STOPPED (asked to stop)  |  -> FAILED (budget exhausted)

Thread: the supervisor is a pykka actor; failures and timer ticks arrive as
messages, so its bookkeeping needs no locks.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import pykka
from tenacity import RetryCallState, wait_exponential_jitter

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler

log = logging.getLogger(__name__)


class Policy(StrEnum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


class ChildState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    BACKING_OFF = "backing_off"
    STOPPED = "stopped"
    FAILED = "failed"


TRANSITIONS: dict[ChildState, frozenset[ChildState]] = {
    ChildState.STARTING: frozenset({ChildState.RUNNING, ChildState.BACKING_OFF,
                                    ChildState.STOPPED, ChildState.FAILED}),
    ChildState.RUNNING: frozenset({ChildState.BACKING_OFF, ChildState.STOPPED,
                                   ChildState.FAILED}),
    ChildState.BACKING_OFF: frozenset({ChildState.STARTING, ChildState.STOPPED,
                                       ChildState.FAILED}),
    ChildState.STOPPED: frozenset(),
    ChildState.FAILED: frozenset(),
}


class Child(Protocol):
    """What a child's start function returns: something that can be stopped."""

    def stop(self) -> None: ...


@dataclass(frozen=True)
class ChildSpec:
    name: str
    start: Callable[[FatalHandler], Child]
    depends_on: tuple[str, ...] = ()  # children declared before this one


@dataclass(frozen=True)
class RestartSettings:
    """``onceflow.supervision`` as the supervisor takes it (defaults: reference.conf)."""

    policy: Policy
    max_restarts: int
    within: float
    backoff_initial: float
    backoff_max: float
    backoff_jitter: float
    max_repeats: int = 0  # the same failure this many times in a row escalates; 0: never


class RestartLoop(RuntimeError):
    """The same failure repeated ``max_repeats`` times in a row with no progress."""

    def __init__(self, child: str, repeats: int, error: BaseException):
        super().__init__(f"child {child} failed {repeats} times in a row with the same "
                         f"error and no progress in between: {error!r}")
        self.child, self.repeats, self.error = child, repeats, error


@dataclass(frozen=True)
class _Failed:
    name: str
    generation: int
    error: BaseException


@dataclass(frozen=True)
class _Restart:
    names: tuple[str, ...]
    generation: int


class _Slot:
    """One child's live instance and bookkeeping."""

    def __init__(self, spec: ChildSpec):
        self.spec = spec
        self.state: ChildState | None = None  # not started yet
        self.instance: Child | None = None
        self.generation = 0
        self.restarts = 0
        self.started = 0.0  # time.monotonic() of the last start

    def move(self, to: ChildState) -> None:
        allowed = {ChildState.STARTING} if self.state is None else TRANSITIONS[self.state]
        if to not in allowed:
            raise RuntimeError(f"child {self.spec.name}: {self.state} -> {to} not allowed")
        self.state = to


class Supervisor(pykka.ThreadingActor):
    def __init__(
        self,
        specs: Sequence[ChildSpec],
        settings: RestartSettings,
        on_escalate: Callable[[str, BaseException], None],
        permanent: Callable[[BaseException], bool] = lambda error: False,
        progress: Callable[[], int] = lambda: 0,
    ):
        super().__init__()
        names = [spec.name for spec in specs]
        for i, spec in enumerate(specs):
            unknown = set(spec.depends_on) - set(names[:i])
            if unknown:
                raise ValueError(f"child {spec.name} depends on {sorted(unknown)}, "
                                 "which are not declared before it")
        self._slots = [_Slot(spec) for spec in specs]
        self._settings = settings
        self._on_escalate = on_escalate
        self._permanent = permanent
        self._history: collections.deque[float] = collections.deque()
        self._progress = progress
        # The last failure: (child, exception type, message), the progress mark
        # when it came, and how many times in a row it came with no progress.
        self._last: tuple[tuple[str, str, str], int] | None = None
        self._repeats = 0
        self._last_error: tuple[str, BaseException, float] | None = None
        self._timers: list[threading.Timer] = []

    def on_start(self) -> None:
        for slot in self._slots:
            self._start(slot)

    def states(self) -> dict[str, ChildState | None]:
        return {slot.spec.name: slot.state for slot in self._slots}

    def restarts(self) -> dict[str, int]:
        return {slot.spec.name: slot.restarts for slot in self._slots}

    def looping(self) -> dict[str, object] | None:
        """The current restart loop, for /health: None unless the last failure came at
        least twice in a row and nothing progressed since."""
        if self._last is None or self._last_error is None or self._repeats < 2 \
                or self._progress() != self._last[1]:
            return None
        child, error, when = self._last_error
        return {"child": child, "repeats": self._repeats, "error": repr(error),
                "seconds_since": round(time.monotonic() - when, 3)}

    def health(self) -> dict[str, object]:
        """What /health needs of the supervisor, in one message: states, the loop, if any,
        and the last failure (child, error, seconds ago)."""
        last = None
        if self._last_error is not None:
            child, error, when = self._last_error
            last = (child, error, time.monotonic() - when)
        return {"states": {k: str(v) for k, v in self.states().items()},
                "looping": self.looping(), "last_failure": last}

    def on_receive(self, message: _Failed | _Restart) -> None:
        if isinstance(message, _Failed):
            self._failed(message)
        elif isinstance(message, _Restart):
            for slot in self._slots:
                if slot.spec.name in message.names and slot.state is ChildState.BACKING_OFF:
                    self._start(slot)

    def on_stop(self) -> None:
        for timer in self._timers:
            timer.cancel()

    def _start(self, slot: _Slot) -> None:
        slot.move(ChildState.STARTING)
        slot.generation += 1
        slot.started = time.monotonic()
        generation, me = slot.generation, self.actor_ref

        def report(who: str, error: BaseException) -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                me.tell(_Failed(slot.spec.name, generation, error))

        try:
            slot.instance = slot.spec.start(report)
        except Exception as error:
            self._failed(_Failed(slot.spec.name, generation, error))
            return
        if slot.state is ChildState.STARTING:
            slot.move(ChildState.RUNNING)

    def _failed(self, failure: _Failed) -> None:
        slot = next(s for s in self._slots if s.spec.name == failure.name)
        live = (ChildState.STARTING, ChildState.RUNNING)
        if failure.generation != slot.generation or slot.state not in live:
            return  # a stale report from an instance already being replaced
        log.error("child %s failed: %r", slot.spec.name, failure.error)
        now = time.monotonic()
        self._history.append(now)
        while self._history and now - self._history[0] > self._settings.within:
            self._history.popleft()
        repeats = self._count_repeat(slot.spec.name, failure.error,
                                     ran=now - slot.started)
        self._last_error = (slot.spec.name, failure.error, now)
        looping = 0 < self._settings.max_repeats <= repeats
        if self._permanent(failure.error) or looping \
                or len(self._history) > self._settings.max_restarts:
            error = failure.error
            if self._permanent(failure.error):
                log.error("a restart cannot fix this: escalating")
            elif looping:
                error = RestartLoop(slot.spec.name, repeats, failure.error)
                log.error("restart loop: %s (max-repeats %d): escalating", error,
                          self._settings.max_repeats)
            else:
                log.error("restart budget exhausted (%d in %.0fs): escalating",
                          self._settings.max_restarts, self._settings.within)
            self._stop_all(ChildState.FAILED)
            self._on_escalate(slot.spec.name, error)
            return
        affected = self._affected(slot)
        for victim in reversed(affected):
            self._stop_instance(victim)
            victim.move(ChildState.BACKING_OFF)
            victim.restarts += 1
            metrics.RESTARTS.labels(victim.spec.name).inc()
        # The n-th failure within `within` waits the n-th backoff: a child that
        # stayed healthy for a whole window starts again from the initial delay.
        delay = self._backoff(len(self._history))
        log.warning("restarting %s in %.2fs (policy %s)", [s.spec.name for s in affected],
                    delay, self._settings.policy)
        timer = threading.Timer(delay, self._tell_restart,
                                (tuple(s.spec.name for s in affected), slot.generation))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _count_repeat(self, child: str, error: BaseException, ran: float) -> int:
        """How many times in a row this failure came with no progress, this one included
        (``ran``: how long the failed incarnation ran)."""
        signature = (child, type(error).__name__, str(error))
        mark = self._progress()
        same = self._last is not None and self._last == (signature, mark) \
            and ran <= self._settings.within
        self._repeats = self._repeats + 1 if same else 1
        self._last = (signature, mark)
        return self._repeats

    def _tell_restart(self, names: tuple[str, ...], generation: int) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(_Restart(names, generation))

    def _affected(self, slot: _Slot) -> list[_Slot]:
        """The children to restart, in start order."""
        policy = self._settings.policy
        index = self._slots.index(slot)
        if policy is Policy.ONE_FOR_ALL:
            chosen = self._slots
        elif policy is Policy.REST_FOR_ONE:
            chosen = self._slots[index:]
        else:
            chosen = [slot]
        names = {s.spec.name for s in chosen}
        for later in self._slots[index + 1:]:  # and whatever depends on a chosen child
            if names.intersection(later.spec.depends_on):
                names.add(later.spec.name)
        return [s for s in self._slots if s.spec.name in names
                and (s is slot or s.state is not ChildState.BACKING_OFF)]

    def _backoff(self, attempt: int) -> float:
        s = self._settings
        wait = wait_exponential_jitter(multiplier=s.backoff_initial, max=s.backoff_max,
                                       jitter=s.backoff_jitter)
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return float(wait(state))

    def _stop_all(self, final: ChildState) -> None:
        for timer in self._timers:
            timer.cancel()
        for slot in reversed(self._slots):
            if slot.state in (None, ChildState.STOPPED, ChildState.FAILED):
                continue
            self._stop_instance(slot)
            slot.move(final)

    @staticmethod
    def _stop_instance(slot: _Slot) -> None:
        if slot.instance is not None:
            try:
                slot.instance.stop()
            except Exception as error:  # stopping a broken child must not stop the rest
                log.warning("stopping %s: %r", slot.spec.name, error)
            slot.instance = None

    def stop_children(self) -> None:
        """Stop every child (used by a graceful shutdown); answers when done."""
        self._stop_all(ChildState.STOPPED)
