"""The faults a chaos run strikes its worker processes with, each at random moments.

A SIGKILL ends a process where it stands (its restart replays what it had not
made durable); a SIGSTOP freezes it. A frozen process keeps its partitions
until its session times out; thawed after that, it is a zombie until it learns
its group moved on: whatever it still sends or writes must be refused or
discarded downstream.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Callable, Sequence

from onceflow.devtools.harness import WorkerProcess

#: With a ``group``, how long every member must have held its assignment before a strike:
#: partitions a strike moved are worked on this long before the next may stall them again.
SETTLED_S = 5.0


async def kills(name: str, worker: WorkerProcess, times: int, rng: random.Random, *,
                down: float, group: Sequence[WorkerProcess] = (),
                say: Callable[[str], None] = print) -> None:
    """SIGKILL ``worker`` ``times`` times, each 0.3-3 s after its current process was
    assigned partitions (with a ``group``, only once every member of it has been settled
    for ``SETTLED_S``: one partition's outage is then one kill's, never two chained),
    restarting it ``down`` seconds later."""
    for n in range(times):
        await worker.assigned()
        await asyncio.sleep(rng.uniform(0.3, 3.0))
        while group and not all((held := member.settled_for()) is not None
                                and held >= SETTLED_S for member in group):
            await asyncio.sleep(rng.uniform(0.3, 3.0))
        if worker.exited() is not None:
            raise RuntimeError(f"{name} exited by itself; see {worker.logs[-1]}")
        worker.kill()
        await asyncio.sleep(down)
        worker.start()
        say(f"  SIGKILL {name} ({n + 1}/{times})")


async def pauses(name: str, worker: WorkerProcess, times: int, rng: random.Random, *,
                 within: tuple[float, float], say: Callable[[str], None] = print
                 ) -> list[float]:
    """Freeze ``worker`` ``times`` times (SIGSTOP, a while, SIGCONT), each 0.3-3 s after
    its current process was assigned partitions; answers how long each pause lasted.

    The pauses alternate between the lower and the upper half of ``within`` (seconds),
    so every second one can outlast a session timeout in the middle. A kill may strike a
    frozen process (SIGKILL ends it as it is); the thaw then reaches its successor,
    which it does not disturb.
    """
    low, high = within
    middle = (low + high) / 2
    frozen: list[float] = []
    for n in range(times):
        await worker.assigned()
        await asyncio.sleep(rng.uniform(0.3, 3.0))
        span = rng.uniform(low, middle) if n % 2 == 0 else rng.uniform(middle, high)
        worker.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(span)
        finally:
            worker.signal(signal.SIGCONT)
        frozen.append(span)
        say(f"  SIGSTOP {name} for {span:.1f}s ({n + 1}/{times})")
    return frozen
