"""Ticker: a daemon thread that tells an actor a message at a fixed interval.

pykka has no timers; the persistence throttle and the commit cadence are
ticks sent from here.
"""

from __future__ import annotations

import threading
from typing import Any

import pykka


class Ticker:
    """Tells ``target`` (any actor: the pipeline or the commit actor) ``message``."""

    def __init__(self, target: pykka.ActorRef[Any], message: object, interval: float):
        self._target = target
        self._message = message
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"tick-{type(message).__name__}", daemon=True
        )

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._target.tell(self._message)
            except pykka.ActorDeadError:
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(self._interval + 1)
