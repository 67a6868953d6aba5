"""Stop signals and the exit deadline: SIGTERM/SIGINT are honoured in every state.

A stop drains what it can within ``onceflow.shutdown.timeout`` and exits.
But a stop can land while a thread blocks where no timeout of ours reaches
(a store that stopped answering, a broker that is gone, a supervisor inside
a restart, a commit that hangs). So a stop also arms a deadline: a daemon
thread ends the process with exit 1 once ``timeout + GRACE`` seconds have
passed. That is safe because only offsets of durable states are ever
committed: whatever was not committed is replayed by the next worker. A
second signal exits at once, with 1 too.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

log = logging.getLogger("onceflow")

EXIT_FORCED = 1
GRACE = 3.0  # s past the shutdown timeout: the last stops (actors, HTTP, group leave)
POLL = 0.1  # s; how often the deadline thread looks (a handler must not set an Event)


class StopSignals:
    """Records SIGTERM/SIGINT; the worker's main thread looks at ``received``.

    The handler only assigns an attribute (or exits, on a second signal).
    Python runs it in the main thread between two bytecodes, possibly inside
    ``Event.wait`` while that holds the event's lock (``Event.set`` there
    would deadlock) or inside a write to stderr (logging there raises
    "reentrant call"). And a signal the kernel hands to another thread does
    not wake a main thread blocked in a lock, so the worker waits with a
    timeout and checks this between waits; the deadline thread checks it
    too, so a main thread blocked for good still ends in time.
    """

    def __init__(self, budget: float = 10.0) -> None:
        self.received: int | None = None
        self.budget = budget  # the shutdown timeout, once the settings are read
        self._logged = False
        self._deadline: tuple[float, str] | None = None
        self._lock = threading.Lock()  # never taken by the handler

    def install(self) -> StopSignals:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        threading.Thread(target=self._watch, name="onceflow-exit-deadline", daemon=True).start()
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # os.write and os._exit are safe in a handler
            os.write(2, f"onceflow: second stop signal ({signal.Signals(signum).name}): "
                        f"exiting at once ({EXIT_FORCED}), committing nothing more\n".encode())
            os._exit(EXIT_FORCED)
        self.received = signum

    def stopping(self) -> bool:
        """Whether a stop signal came (logged once, from the calling thread)."""
        if self.received is not None and not self._logged:
            self._logged = True
            log.info("received %s: stopping (at most %.1fs)", signal.Signals(self.received).name,
                     self.budget + GRACE)
        return self.received is not None

    def exit_within(self, seconds: float, why: str) -> None:
        """End the process with exit 1 if it still runs ``seconds`` from now (the earliest
        deadline armed wins)."""
        at = time.monotonic() + seconds
        with self._lock:
            if self._deadline is None or at < self._deadline[0]:
                self._deadline = (at, why)

    def _watch(self) -> None:
        armed_for_signal = False
        while True:
            time.sleep(POLL)
            if self.received is not None and not armed_for_signal:
                armed_for_signal = True
                self.exit_within(self.budget + GRACE,
                                 f"{signal.Signals(self.received).name}")
            deadline = self._deadline
            if deadline is not None and time.monotonic() >= deadline[0]:
                os.write(2, f"onceflow: still running past the deadline of the stop "
                            f"({deadline[1]}): exiting now ({EXIT_FORCED}); only durable "
                            "offsets were committed, the rest is replayed\n".encode())
                os._exit(EXIT_FORCED)
