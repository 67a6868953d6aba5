"""The store of a ``TestRun``: the rows a worker's store would hold, in dicts.

States, open-window index rows, producer sequences and merge log starts are kept as
the worker writes them, (stage, key) -> encoded bytes, and read back through the same
decoders; closed windows as history rows; key homes claimed set-if-absent. What a
crash keeps is what is here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from onceflow.stages.declarations import MERGE_LOG_STAGE
from onceflow.stages.merge_log import Start, decode_start
from onceflow.stages.pipeline import Aggregate
from onceflow.stages.producer_dedup import SEQUENCE_STAGE
from onceflow.stages.state import AggregateState, TopicPartition, decode_state
from onceflow.stages.watermark import WINDOWS_STAGE

__all__ = ["MemoryStore"]


class MemoryStore:
    """Rows by (stage, key), history rows by (stage, key, window start), key homes."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}  # (stage, key) -> encoded row
        self.history: dict[tuple[str, str, int], bytes] = {}  # (stage, key, start) -> value
        self.homes: dict[tuple[str, str], TopicPartition] = {}

    def stage_rows(self, stage_id: str) -> dict[str, bytes]:
        """Every row of one stage, by key."""
        return {key: value for (stage, key), value in self.rows.items() if stage == stage_id}

    def stage_history(self, stage_id: str) -> Iterator[tuple[str, int, bytes]]:
        """One stage's closed windows: (key, window start, final value)."""
        for (stage, key, start), value in self.history.items():
            if stage == stage_id:
                yield key, start, value

    def load(self, spec: Aggregate, keys: Sequence[str]) -> dict[str, AggregateState]:
        """The runner's state loader."""
        return {key: decode_state(row) for key, row in self._found(spec.id, keys).items()}

    def load_rows(self, store: str, keys: Iterable[str]) -> dict[str, bytes]:
        """The open-window index rows (one store here, whichever ``store`` names)."""
        return self._found(WINDOWS_STAGE, keys)

    def load_sequences(self, keys: Sequence[str]) -> dict[str, bytes]:
        return self._found(SEQUENCE_STAGE, keys)

    def log_starts(self, numbers: list[int]) -> dict[int, Start]:
        """Where each co-partition's merge log is read from (none stored: from its start)."""
        found = self._found(MERGE_LOG_STAGE, [str(n) for n in numbers])
        starts = {int(n): decode_start(row) for n, row in found.items()}
        return {n: start for n, start in starts.items() if start is not None}

    def claim(self, spec: Aggregate, feeders: Mapping[str, TopicPartition]
              ) -> dict[str, TopicPartition]:
        """Each key's home: the first partition that fed it."""
        return {key: self.homes.setdefault((spec.id, key), fed) for key, fed in feeders.items()}

    def _found(self, stage_id: str, keys: Iterable[str]) -> dict[str, bytes]:
        found = ((key, self.rows.get((stage_id, key))) for key in keys)
        return {key: row for key, row in found if row is not None}
