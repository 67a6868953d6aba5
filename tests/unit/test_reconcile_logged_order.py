"""The merge log's runs a reconcile replays: cut at the committed offsets, gaps named."""

from __future__ import annotations

from onceflow.reconcile.order import logged_order, ordered_inputs
from onceflow.stages import Pipeline
from onceflow.stages.merge_log import Run


def counted() -> Pipeline:
    return Pipeline("p", topics=("in",), format="json").aggregate(
        "n", key=lambda e: str(e["k"]), init=lambda: 0, fold=lambda n, _: n + 1)


def test_a_single_worker_over_several_partitions_is_ordered_across_them() -> None:
    assert ordered_inputs(counted(), True, {("in", 0): 3, ("in", 1): 2}) == ({"in"}, True)
    assert ordered_inputs(counted(), True, {("in", 0): 3}) is None  # one partition: no log
    assert ordered_inputs(counted(), False, {("in", 0): 3, ("in", 1): 2}) is None


def test_runs_past_the_commits_are_dropped_and_one_across_them_cut() -> None:
    logged = {0: [Run("in", 0, 1, 0), Run("in", 0, 2, 1), Run("in", 2, 4, 0),
                  Run("in", 3, 5, 1), Run("other", 0, 9, 0), Run("in", 5, 6, None)]}
    order = logged_order(logged, {"in"}, True, {("in", 0): 3, ("in", 1): 3})
    assert order.runs == {0: [Run("in", 0, 1, 0), Run("in", 0, 2, 1), Run("in", 2, 2, 0)]}
    assert order.gaps == []


def test_input_no_run_covers_is_named_as_unordered() -> None:
    logged = {0: [Run("in", 2, 3, 0), Run("in", 6, 7, 0)]}  # the log's head trimmed: 0..1
    order = logged_order(logged, {"in"}, True, {("in", 0): 9, ("in", 1): 2, ("in", 2): 0})
    assert order.gaps == ["in/0 offsets 0..1", "in/0 offsets 4..5", "in/0 offsets 8..8",
                          "in/1 offsets 0..1"]


def test_a_joins_log_names_each_co_partition_by_its_log_partition() -> None:
    logged = {1: [Run("stream", 0, 4), Run("table", 0, 1)], 0: [Run("table", 0, 0)]}
    order = logged_order(logged, {"stream", "table"}, False,
                         {("stream", 0): 0, ("stream", 1): 3, ("table", 0): 1, ("table", 1): 2})
    assert order.runs == {0: [Run("table", 0, 0)], 1: [Run("stream", 0, 2), Run("table", 0, 1)]}
    assert order.gaps == []
