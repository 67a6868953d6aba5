"""A private asyncio event loop on its own daemon thread.

aiokafka is asyncio-only while the actors are threads: the consumer and
producer actors run their client coroutines here and wait on the returned
concurrent futures, so no actor thread ever runs an event loop itself. The
worker's tickers (persistence, commit, stats) are timers on this loop too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class Timer:
    """A repeating loop timer (``EventLoopThread.every``); a failing ``fn`` is logged and
    the timer goes on (each tick only hands work to someone who reports its own failure)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float,
                 fn: Callable[[], object]):
        self._loop, self._interval, self._fn = loop, interval, fn
        self._handle: asyncio.TimerHandle | None = None
        self._cancelled = False

    def arm(self) -> None:
        if not self._cancelled:
            self._handle = self._loop.call_later(self._interval, self._tick)

    def _tick(self) -> None:
        try:
            self._fn()
        except Exception:
            log.exception("timer callback %r failed", self._fn)
        self.arm()

    def cancel(self) -> None:
        """Stop ticking; safe from any thread."""
        self._cancelled = True
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._cancel_handle)

    def _cancel_handle(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


class EventLoopThread:
    """Owns one event loop and the thread that runs it forever."""

    def __init__(self, name: str = "onceflow-kafka"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; safe from any thread."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (never call from the loop)."""
        return self.submit(coro).result(timeout)

    def call_soon(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def every(self, interval: float, fn: Callable[[], object]) -> Timer:
        """Call ``fn`` on the loop every ``interval`` seconds until the timer is cancelled
        (or the loop stops): the worker's tickers, without a thread each."""
        timer = Timer(self.loop, interval, fn)
        self.loop.call_soon_threadsafe(timer.arm)
        return timer

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; whoever still waits on it is woken with ``CancelledError``.

        A stopped loop never resolves the futures of the coroutines it was
        running, so a thread blocked in ``run`` (an actor still starting up)
        would wait out its whole timeout and, being a non-daemon actor
        thread, hold the process's exit as long.
        """
        with self._lock:
            pending, self._pending = self._pending, set()
        for future in pending:
            future.cancel()  # also cancels the coroutine's task on the loop
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
