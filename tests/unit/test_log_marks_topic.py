"""A store-less pipeline's log marks: its snapshots write them to the marks given (its
topic, ``kafka.log_marks_topic``), and the topic's records read back as rows.

The whole path against a real broker (commit, re-create, refuse, forget, republish
the new records) is ``tests/integration/test_recreated_stateless.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from persistence_doubles import DictStore

from onceflow.actors.messages import Snapshot
from onceflow.checkpoint.ledger import Ledger
from onceflow.checkpoint.log_marks import LOGS_STAGE, NO_MARK, LogMark
from onceflow.checkpoint.persistence import StoreWriter
from onceflow.kafka.log_marks_topic import _only_marks, last_values, log_marks_topic
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing import Guard

A: TopicPartition = ("orders", 0)
B: TopicPartition = ("orders", 1)


@dataclass
class Record:
    key: bytes | None
    value: bytes | None


class Marks:
    """A ``MarkRows`` that keeps what it was given."""

    def __init__(self) -> None:
        self.saved: list[dict[str, bytes]] = []

    def load(self, stage_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return {}

    def save(self, stage_id: str, rows: Mapping[str, bytes], *,
             guard: Guard | None = None) -> None:
        assert stage_id == LOGS_STAGE
        self.saved.append(dict(rows))


def _snapshot() -> Snapshot:
    ledger = Ledger()
    ledger.assigned({A: 0, B: 0})
    ledger.processed({A: 5, B: 3}, sent=True, marks={A: LogMark(4, 9, "x"),
                                                     B: LogMark(2, 8, "y")})
    ledger.settled(1)
    checkpoint = ledger.take(dirty=False)
    assert checkpoint is not None
    return Snapshot([], checkpoint)


def test_a_snapshot_of_a_storeless_pipeline_writes_its_marks_to_the_marks_given() -> None:
    marks = Marks()
    StoreWriter(stores={}, stats_store=None, marks=marks).write(_snapshot())
    assert marks.saved == [{"orders|0": LogMark(4, 9, "x").encode(),
                            "orders|1": LogMark(2, 8, "y").encode()}]


def test_a_pipeline_with_a_store_keeps_its_marks_there() -> None:
    store, marks = DictStore(), Marks()
    StoreWriter(stores={"mem": store}, stats_store=None, marks=marks).write(_snapshot())
    assert marks.saved == []
    assert store.rows[(LOGS_STAGE, "orders|0")] == LogMark(4, 9, "x").encode()


def test_the_topic_reads_back_as_each_keys_last_value() -> None:
    mark = LogMark(7, 1, "z").encode()
    records = [Record(b"orders|0", LogMark(1, 1, "a").encode()), Record(b"orders|1", mark),
               Record(None, b"stray"), Record(b"orders|0", NO_MARK),
               Record(b"gone|0", mark), Record(b"gone|0", None)]
    assert last_values(records) == {"orders|0": NO_MARK, "orders|1": mark}
    assert log_marks_topic("mirror") == "mirror-log-marks"


def test_the_topic_holds_marks_only() -> None:
    _only_marks(LOGS_STAGE)
    with pytest.raises(ValueError, match="holds stage"):
        _only_marks("totals")
