"""Which store each part of a worker uses: a stateless republisher none at all.

``outbox-store = auto`` once gave every pipeline without an aggregate a Redis
outbox, so a republisher could not run without Redis (issue 32, item 1).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from pathlib import Path

import pytest

from onceflow.runtime.config import Settings, load_settings
from onceflow.runtime.wiring import (
    describe_store_uses,
    open_stores,
    outbox_store,
    store_uses,
    unfenced_stores,
)
from onceflow.stages.declarations import ProducerDedup
from onceflow.stages.pipeline import Pipeline

PARTS = ("states", "producer dedup", "fencing epochs", "log marks", "stats", "outbox")


Make = Callable[..., Settings]


@pytest.fixture
def settings(tmp_path: Path) -> Make:
    def make(outbox: str = "auto") -> Settings:
        conf = tmp_path / "app.conf"
        conf.write_text('onceflow.pipeline = "m:p"\n')
        return load_settings(conf, {"onceflow.kafka.producer.outbox-store": outbox})
    return make


def republisher(exclusive: bool = False, dedup: ProducerDedup | None = None) -> Pipeline:
    return (Pipeline("rep", topics=("raw",), format="json", dedup=dedup)
            .filter("some", bool)
            .flat_map("parts", lambda v: [v, v])
            .republish("out", "normalized", exclusive=exclusive))


def counting(*stores: str) -> Pipeline:
    built = Pipeline("agg", topics=("t",))
    for i, store in enumerate(stores):
        built = built.aggregate(f"a{i}", key=str, init=int, fold=lambda n, _: n + 1,
                                store=store)
    return built


def by_seq(store: str | None = None) -> ProducerDedup:
    return ProducerDedup(producer=itemgetter("p"), sequence=itemgetter("s"), store=store)


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_stateless_republisher_uses_no_store_at_all(settings: Make, exclusive: bool
                                                      ) -> None:
    s, pipeline = settings(), republisher(exclusive)
    assert outbox_store(s, pipeline) is None  # was "redis"
    assert store_uses(s, pipeline) == dict.fromkeys(PARTS)
    assert open_stores(s, pipeline) == {}
    assert unfenced_stores(s, pipeline) == []
    line = describe_store_uses(s, pipeline)
    assert line.startswith("stores: none (states none; producer dedup none; fencing epochs "
                           f"none; log marks topic {pipeline.id}-log-marks; stats none; "
                           "outbox none): ")
    for consequence in ("replays from the last commit", "re-created input topic is "
                        "refused", "not fenced against a paused worker"):
        assert consequence in line


def test_an_outbox_stays_a_choice_for_a_stateless_republisher(settings: Make) -> None:
    for kind in ("redis", "cassandra"):
        s = settings(kind)
        assert outbox_store(s, republisher()) == kind
        assert store_uses(s, republisher()) == {**dict.fromkeys(PARTS), "outbox": kind}
        assert describe_store_uses(s, republisher()) == (
            "stores: states none; producer dedup none; fencing epochs none; log marks "
            f"topic {republisher().id}-log-marks; stats none; outbox {kind}")
    assert outbox_store(settings("none"), republisher()) is None


def test_a_producer_dedup_table_needs_its_store_and_auto_puts_the_outbox_there(
        settings: Make) -> None:
    s = settings()
    pipeline = republisher(dedup=by_seq("cassandra"))
    assert outbox_store(s, pipeline) == "cassandra"  # was "redis": unfenced, another store
    assert store_uses(s, pipeline) == {
        "states": None, "producer dedup": "cassandra", "fencing epochs": "cassandra",
        "log marks": "cassandra", "stats": "cassandra", "outbox": "cassandra"}
    assert outbox_store(settings("none"), pipeline) is None


def test_aggregates_keep_their_stores_and_the_epochs_go_to_redis_first(settings: Make
                                                                       ) -> None:
    s = settings()
    assert store_uses(s, counting("cassandra", "redis")) == {
        "states": "cassandra, redis", "producer dedup": None, "fencing epochs": "redis",
        "log marks": "cassandra", "stats": "cassandra", "outbox": "cassandra"}
    assert store_uses(s, counting("redis")) == {
        "states": "redis", "producer dedup": None, "fencing epochs": "redis",
        "log marks": "redis", "stats": "redis", "outbox": "redis"}
    with_dedup = Pipeline("d", topics=("t",), format="json", dedup=by_seq()).aggregate(
        "a", key=str, init=int, fold=lambda n, _: n + 1, store="cassandra")
    assert store_uses(s, with_dedup)["producer dedup"] == "cassandra"  # the aggregate's
    assert describe_store_uses(settings("none"), counting("redis")) == (
        "stores: states redis; producer dedup none; fencing epochs redis; log marks redis; "
        "stats redis; outbox none")
