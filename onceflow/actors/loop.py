"""A private asyncio event loop on its own daemon thread.

aiokafka is asyncio-only while the actors are threads: the consumer and
producer actors run their client coroutines here and wait on the returned
concurrent futures, so no actor thread ever runs an event loop itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
