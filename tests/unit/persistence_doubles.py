"""The persistence actor's neighbour in unit tests: a fenced store in a dict.

``DictStore`` checks guards as Redis's script does (every epoch equal, or
nothing written and ``Fenced``), and takes epochs from a counter; the real
script is tested against Redis in ``tests/integration/test_fencing_redis.py``.
Shared by ``test_log_marks`` and ``test_persistence_fencing``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from onceflow.stages.state import TopicPartition
from onceflow.stores.base import OutboxKey, StateStore
from onceflow.stores.fencing import Guard, Taken, first_mismatch


class DictStore(StateStore):
    """Rows in a dict; epochs taken from a counter, guards checked like Redis's script.
    ``guards`` and ``saved``: what each write that landed carried, in order."""

    fenced = atomic_fence = True

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}
        self.epochs: dict[TopicPartition, int] = {}
        self.counter = 0
        self.guards: list[Guard | None] = []
        self.saved: list[str] = []
        self.stats: dict[str, int] = {}

    def _check(self, guard: Guard | None) -> None:
        refused = first_mismatch(guard or {}, self.epochs)
        if refused is not None:
            raise refused

    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return {k: self.rows[(stage_id, k)] for k in keys if (stage_id, k) in self.rows}

    def save(self, stage_id: str, rows: Mapping[str, bytes], *, guard: Guard | None = None
             ) -> None:
        self._check(guard)
        self.guards.append(guard)
        self.saved.append(stage_id)
        self.rows.update({(stage_id, k): v for k, v in rows.items()})

    def check_epochs(self, guard: Guard) -> None:
        self._check(guard)

    def scan(self, stage_id: str) -> Iterator[tuple[str, bytes]]:
        return iter([(k, v) for (s, k), v in list(self.rows.items()) if s == stage_id])

    def take_epochs(self, partitions: Sequence[tuple[str, int]], floor: int = 0) -> Taken:
        self.counter += 1
        previous = {tp: self.epochs.get(tp) for tp in partitions}
        self.epochs.update(dict.fromkeys(partitions, self.counter))
        return Taken(self.counter, previous)

    def claim_homes(self, stage_id: str, proposals: Mapping[str, str]) -> dict[str, str]:
        raise NotImplementedError

    def outbox_append(self, rows: Mapping[OutboxKey, bytes], *, guard: Guard | None = None
                      ) -> None:
        raise NotImplementedError

    def outbox_remove(self, keys: Sequence[OutboxKey]) -> None:
        raise NotImplementedError

    def outbox_load(self) -> dict[str, list[tuple[int, bytes]]]:
        raise NotImplementedError

    def add_stats(self, counters: Mapping[str, int]) -> None:
        for name, n in counters.items():
            self.stats[name] = self.stats.get(name, 0) + n

    def read_stats(self) -> dict[str, int]:
        return dict(self.stats)

    def close(self) -> None:
        pass
