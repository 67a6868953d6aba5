"""One CPU for all of a worker's threads, while the machine has room for it.

Only the thread holding the GIL runs Python, so a worker uses about one core however many
the machine has. Left to the OS, its threads (the Kafka loop, the pipeline, persistence)
land on different cores as the GIL passes between them, and the interpreter's hot state
(reference counts, allocator pools, the batch just fetched) crosses the caches with it:
measured on the envelope path, the pipeline thread spent 1.5x the CPU per record on the
same code, even on records it had copied itself, and the worker ran at 0.59-0.67 of a raw
aiokafka loop against 0.85-0.89 with its threads on one CPU (journal 2026-11-29).

``auto`` (``onceflow.cpu``) keeps the threads together on one CPU and lets go where that
costs more than it saves: every few seconds it reads how busy each CPU was
(``/proc/stat``) and how much of it was this worker, and

- pinned, and other processes took a quarter of its CPU while another CPU has more room
  than this worker gets here, it moves there (on a coin flip, so that two workers crowding
  one CPU do not both move at once); with no such CPU it lets the OS place its threads;
- not pinned, where the others leave a whole CPU and a half idle, it pins to the least busy.

A number pins to that CPU for good; ``off`` leaves placement to the OS. Threads started
later inherit their creator's CPU; every check pins any thread that is not on it yet.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

INTERVAL = 3.0  # s between checks, jittered by a third either way
CROWDED = 0.25  # others' share of our CPU from which a move is considered
MARGIN = 0.05  # how much more room another CPU must have than we get here
SPARE = 1.5  # CPUs the others must leave idle before an unpinned worker pins again
PROC = Path("/proc")


def supported() -> bool:
    """Whether this platform pins threads (Linux: ``sched_setaffinity`` and ``/proc``)."""
    return hasattr(os, "sched_setaffinity") and (PROC / "stat").exists()


def cpu_ticks(proc: Path = PROC) -> dict[int, tuple[int, int]]:
    """Each CPU's (busy, total) clock ticks since boot, from ``/proc/stat``."""
    ticks: dict[int, tuple[int, int]] = {}
    for line in (proc / "stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            counts = [int(f) for f in fields]
            idle = counts[3] + (counts[4] if len(counts) > 4 else 0)  # idle + iowait
            ticks[int(name[3:])] = (sum(counts[:8]) - idle, sum(counts[:8]))
    return ticks


def own_ticks(proc: Path = PROC) -> int:
    """This process's user + system clock ticks, all its threads."""
    fields = (proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Sample(NamedTuple):
    """What one check reads: each allowed CPU's (busy, total) ticks, this process's ticks,
    and when (``time.monotonic``)."""

    cpus: dict[int, tuple[int, int]]
    own: int
    at: float


def next_cpu(pinned: int | None, busy: Mapping[int, float], own: float,
             flip: Callable[[], bool]) -> int | None:
    """Where the threads go next: a CPU, or None to leave them to the OS.

    ``busy``: each allowed CPU's busy share over the last interval (0..1); ``own``: this
    worker's share of one CPU over it; ``flip``: a coin, for moves that others may make too.
    """
    if pinned is not None:
        others_here = busy.get(pinned, 0.0) - own
        if others_here < CROWDED:
            return pinned
        candidates = [cpu for cpu in busy if cpu != pinned]
        if not candidates:
            return pinned
        best = min(candidates, key=lambda cpu: (busy[cpu], cpu))
        if 1.0 - busy[best] > own + MARGIN:
            return best if flip() else pinned
        return None
    if not busy or sum(busy.values()) - own > len(busy) - SPARE:
        return None
    best = min(busy, key=lambda cpu: (busy[cpu], cpu))
    return best if flip() else None


class CpuPlacement:
    """Pins a worker's threads as ``onceflow.cpu`` says; ``tick()`` from a thread that wakes
    often (the worker's main loop), ``release()`` at the end (an in-process worker must not
    leave its host pinned)."""

    def __init__(self, mode: str | int, proc: Path = PROC,
                 chance: random.Random | None = None) -> None:
        self.mode = mode
        self._proc = proc
        self._random = chance or random.Random()
        self._allowed = frozenset(os.sched_getaffinity(0)) if supported() else frozenset()
        self.pinned: int | None = None
        self._due = 0.0
        self._decided = False  # the first decision takes no coin: nobody has moved yet
        self._last: Sample | None = None
        self._ticks_per_second = os.sysconf("SC_CLK_TCK") if supported() else 100

    @property
    def active(self) -> bool:
        return self.mode != "off" and len(self._allowed) > 1

    def start(self) -> None:
        """A fixed CPU now; ``auto`` samples now and decides at the first check."""
        if not self.active:
            return
        if isinstance(self.mode, int):
            self._pin(self.mode, "as onceflow.cpu says")
            return
        self._guarded(self._sample_first)

    def tick(self) -> None:
        """Check the placement when due (``auto``), and pin threads started since."""
        if not self.active or time.monotonic() < self._due:
            return
        self._due = time.monotonic() + INTERVAL * self._random.uniform(2 / 3, 4 / 3)
        if self.mode == "auto":
            self._guarded(self._decide)
        if self.pinned is not None:
            self._apply({self.pinned})

    def _sample_first(self) -> None:
        self._last = self._sample()
        self._due = time.monotonic() + INTERVAL / 2

    def _guarded(self, step: Callable[[], None]) -> None:
        """A ``/proc`` this code cannot read turns ``auto`` off: placement is worth speed,
        never a worker's life (it runs on the worker's main loop)."""
        try:
            step()
        except (OSError, ValueError, IndexError, KeyError) as error:
            log.warning("cannot read how busy the CPUs are (%r): onceflow.cpu is off", error)
            self.release()  # back on every CPU, if it can list the threads
            self.mode = "off"

    def release(self) -> None:
        """Every thread back on every CPU the process was allowed at start."""
        if self.active and self.pinned is not None:
            self.pinned = None
            self._apply(set(self._allowed))

    def _sample(self) -> Sample:
        ticks = cpu_ticks(self._proc)
        return Sample({cpu: t for cpu, t in ticks.items() if cpu in self._allowed},
                      own_ticks(self._proc), time.monotonic())

    def _decide(self) -> None:
        now = self._sample()
        before, self._last = self._last, now
        if before is None:
            return
        seconds = now.at - before.at
        if seconds <= 0:
            return
        busy = {cpu: (b - before.cpus[cpu][0]) / max(1, t - before.cpus[cpu][1])
                for cpu, (b, t) in now.cpus.items() if cpu in before.cpus}
        own = (now.own - before.own) / self._ticks_per_second / seconds
        first, self._decided = not self._decided, True
        target = next_cpu(self.pinned, busy, own,
                          (lambda: True) if first else (lambda: self._random.random() < 0.5))
        if target == self.pinned:
            return
        shares = ", ".join(f"CPU {cpu} {share:.0%}" for cpu, share in sorted(busy.items()))
        if target is None:
            log.info("threads left to the OS: CPU %s is crowded and no CPU has room "
                     "(this worker %.0f%% of a CPU; %s)", self.pinned, own * 100, shares)
            self.pinned = None
            self._apply(set(self._allowed))
        else:
            self._pin(target, f"this worker {own:.0%} of a CPU; {shares}")

    def _pin(self, cpu: int, why: str) -> None:
        was, self.pinned = self.pinned, cpu
        if self._apply({cpu}):
            log.info("threads kept on CPU %d%s (%s)", cpu,
                     "" if was is None else f", moved from CPU {was}", why)

    def _apply(self, cpus: set[int]) -> bool:
        """Every thread of the process on ``cpus``; False (and placement off) where refused."""
        try:
            tasks = [int(task.name) for task in (self._proc / "self" / "task").iterdir()]
        except OSError as error:
            log.warning("cannot list this process's threads (%r): onceflow.cpu is off", error)
            self.mode, self.pinned = "off", None
            return False
        for tid in tasks:
            try:
                if os.sched_getaffinity(tid) != cpus:
                    os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
            except OSError as error:  # a container that forbids it: leave placement alone
                log.warning("cannot place threads on CPU %s (%s): onceflow.cpu is off",
                            sorted(cpus), error)
                self.mode, self.pinned = "off", None
                return False
        return True
