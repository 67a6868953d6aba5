"""``StateStore`` is the sum of small protocols, one per concern, and a caller needs only its own.

Each public member of ``StateStore`` is declared by exactly one protocol (a new method
must pick its concern), and a caller hinted with one protocol runs on a double that
implements that protocol alone: ``read_states`` over bare state rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from onceflow import Pipeline
from onceflow.runtime.states import _rows
from onceflow.stages.state import AggregateState, encode_state
from onceflow.stores.base import (
    Connection,
    EpochCounter,
    HistoryRows,
    KeyHomes,
    Outbox,
    StateRows,
    StateStore,
    Stats,
)
from onceflow.stores.fencing import Guard

PROTOCOLS = (StateRows, HistoryRows, KeyHomes, EpochCounter, Outbox, Stats, Connection)


def declared(cls: type) -> set[str]:
    """The public members a class declares itself: methods and annotated attributes."""
    return {name for name in (*vars(cls), *vars(cls).get("__annotations__", {}))
            if not name.startswith("_")}


def test_every_member_of_the_store_belongs_to_exactly_one_concern() -> None:
    members = [name for protocol in PROTOCOLS for name in declared(protocol)]
    assert len(members) == len(set(members))  # no member in two protocols
    public = {name for name in dir(StateStore) if not name.startswith("_")}
    assert public == set(members)
    assert len(public) == 23  # 20 methods, the two fencing flags, the history retention


class Rows:
    """Only ``StateRows``: what reading a stage's states needs, and nothing of the rest."""

    def __init__(self, rows: dict[str, bytes]) -> None:
        self.rows = rows

    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return {key: self.rows[key] for key in keys if key in self.rows}

    def save(self, stage_id: str, rows: Mapping[str, bytes], *, guard: Guard | None = None
             ) -> None:
        self.rows.update(rows)

    def scan(self, stage_id: str) -> Iterator[tuple[str, bytes]]:
        return iter(sorted(self.rows.items()))

    def row_name(self, stage_id: str, key: str) -> str:
        return key


def test_reading_states_needs_only_the_state_rows() -> None:
    spec = (Pipeline("p", topics=("t",))
            .aggregate("count", key=str, init=lambda: 0, fold=lambda n, _: n + 1)).aggregates[0]
    rows: StateRows = Rows({"a": encode_state(AggregateState(2)),
                            "b": encode_state(AggregateState(5))})
    assert list(_rows(rows, None, spec, None)) == [
        {"stage": "count", "key": "a", "value": 2}, {"stage": "count", "key": "b", "value": 5}]
    assert [row["value"] for row in _rows(rows, None, spec, "b")] == [5]
