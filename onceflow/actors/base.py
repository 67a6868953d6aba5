"""The actor base: every failure is reported to the worker, never only logged.

pykka has no supervision of its own: an actor that fails (at start or in a
message) tells ``on_fatal``, which the worker wires to the supervisor
(``onceflow.actors.supervisor``); the supervisor stops the incarnation,
commits only what is durable, and restarts it or escalates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

import pykka

FatalHandler = Callable[[str, BaseException], None]

log = logging.getLogger(__name__)


class ReportingActor(pykka.ThreadingActor):
    """A threading actor whose start and message failures reach ``on_fatal``."""

    def __init__(self, on_fatal: FatalHandler):
        super().__init__()
        self._on_fatal = on_fatal

    def on_start(self) -> None:
        try:
            self.start_up()
        except Exception as error:
            self._on_fatal(type(self).__name__, error)
            raise

    def start_up(self) -> None:
        """Override instead of on_start: failures here are reported too."""

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._on_fatal(type(self).__name__, exception_value or RuntimeError("unknown failure"))


class LoopActor:
    """An actor without a thread of its own: a Kafka client's owner on the event loop.

    Its per-batch work runs on the loop where the client lives (no thread only
    forwards into it); the supervised child that holds it calls its lifecycle
    (``start``, ``stop``) and waits; every failure of its loop tasks reaches
    ``on_fatal``, so the supervisor restarts it (docs/architecture.md, section 3).
    """

    def __init__(self, on_fatal: FatalHandler):
        self._on_fatal = on_fatal
