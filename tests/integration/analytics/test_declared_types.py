"""A declared value type types the columns as declared, where inference gives up."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from onceflow.analytics.frames import typed


@dataclass
class Counts:
    ok: int
    failed: int
    by_hour: dict[str, int]


def frame_of(spark: Any, values: list[Any]) -> Any:
    rows = [("p", "s", f"k{i}", json.dumps(v)) for i, v in enumerate(values)]
    return spark.createDataFrame(rows, "pipeline string, stage string, key string, "
                                       "value_json string")


def test_declared_struct_gives_nested_columns_inference_refuses(spark: Any) -> None:
    values = [{"ok": 3, "failed": 1, "by_hour": {"09": 4}},
              {"ok": 5, "failed": 0, "by_hour": {}},
              {"ok": "many", "failed": 2, "by_hour": {"10": 2}}]  # ok does not match
    frame = frame_of(spark, values)
    assert typed(spark, frame).columns == frame.columns  # nested: inference gives up
    rows = {r["key"]: r for r in typed(spark, frame, Counts).collect()}
    assert (rows["k0"]["ok"], rows["k0"]["failed"], rows["k0"]["by_hour"]) == (3, 1, {"09": 4})
    assert (rows["k1"]["ok"], rows["k1"]["by_hour"]) == (5, {})
    assert rows["k2"]["ok"] is None  # a value that does not match: null, kept in value_json
    assert json.loads(rows["k2"]["value_json"]) == values[2]


def test_declared_scalar_is_the_value_column(spark: Any) -> None:
    frame = frame_of(spark, [7, 12.5, "x"])
    rows = {r["key"]: r["value"] for r in typed(spark, frame, float).collect()}
    assert rows == {"k0": 7.0, "k1": 12.5, "k2": None}
