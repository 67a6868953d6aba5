"""``onceflow reconcile`` of a join: the replay meets the table row the worker met, in the
merge log's order, however the topics are fetched (no services).

The worker (a ``TestRun``) applies merchant m1 = "food", a payment of 10, m1 = "toys",
a payment of 5, in that order, and logs it. The reconcile reads the topics one after
the other (the table first): in that order both payments meet "toys"; in the logged
order they meet the rows the worker's did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onceflow import Pipeline
from onceflow.reconcile.order import logged_order, ordered_inputs
from onceflow.reconcile.replay import Replay
from onceflow.runtime.config import load_settings
from onceflow.stages import Table
from onceflow.testing import Record, TestRun

MERCHANTS = Table("merchants", format="json")


def payments() -> Pipeline[Any]:
    return (Pipeline("pay", topics=("payments",), format="json")
            .join("merchant", table=MERCHANTS, on=lambda p: p["merchant"],
                  merge=lambda p, row: {**p, "category": None if row is None else row["cat"]})
            .aggregate("totals", key=lambda v: str(v["category"]), init=lambda: 0,
                       fold=lambda total, v: total + v["amount"]))


def merchant(cat: str) -> Record:
    return Record({"cat": cat}, topic="merchants", key="m1")


def payment(amount: int) -> Record:
    return Record({"merchant": "m1", "amount": amount}, topic="payments")


def test_the_replay_of_a_join_follows_the_merge_log(tmp_path: Path) -> None:
    worker = TestRun(payments(), single_worker=False)  # as the settings: several workers
    for record in (merchant("food"), payment(10), merchant("toys"), payment(5)):
        worker.feed([record])
    worker.commit()
    assert worker.states("totals") == {"food": 10, "toys": 5}

    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "unused:pipeline"\n')
    settings = load_settings(conf)
    committed = {("merchants", 0): 2, ("payments", 0): 2}
    shape = ordered_inputs(payments(), settings.single_worker, committed)
    assert shape == ({"payments", "merchants"}, False)
    order = logged_order(worker.merge_log.runs, *shape, committed)
    assert order.gaps == []
    fetched = [merchant("food"), merchant("toys"), payment(10), payment(5)]  # table first

    replay = Replay(payments(), settings, order=order)
    replay.feed(fetched)
    replay.persist()
    assert {k: s.value for k, s in replay.recomputed("totals").items()} == {"food": 10,
                                                                            "toys": 5}
    assert replay.runner.unreplayed == []  # type: ignore[union-attr]

    unordered = logged_order({}, *shape, committed)  # no log: the order is unknown
    assert unordered.gaps == ["merchants/0 offsets 0..1", "payments/0 offsets 0..1"]
    naive = Replay(payments(), settings, order=unordered)
    naive.feed(fetched)
    naive.persist()
    assert {k: s.value for k, s in naive.recomputed("totals").items()} == {"toys": 15}
