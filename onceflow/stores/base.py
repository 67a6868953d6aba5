"""One interface for every state store: encoded states in, encoded states out.

Stores see opaque bytes (a state and its watermarks, encoded together by
``onceflow.stages.state``), so one ``save`` of a key is one atomic write of
the state with its watermarks whatever the backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence


class StateStore(ABC):
    """Per-key state rows of one pipeline, namespaced by stage id."""

    @abstractmethod
    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Batched read; keys never written are absent from the result."""

    @abstractmethod
    def save(self, stage_id: str, rows: Mapping[str, bytes]) -> None:
        """Write every row; each row is written atomically on its own."""

    @abstractmethod
    def scan(self, stage_id: str) -> Iterator[tuple[str, bytes]]:
        """Every row of a stage (for verification and analytics, not the hot path)."""

    @abstractmethod
    def add_stats(self, counters: Mapping[str, int]) -> None:
        """Add to the pipeline's running counters (best effort, for reports)."""

    @abstractmethod
    def read_stats(self) -> dict[str, int]: ...

    @abstractmethod
    def close(self) -> None: ...
