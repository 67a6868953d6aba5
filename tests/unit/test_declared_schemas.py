"""Declared aggregate value types become the Spark types analytics read values with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import pytest
from pyspark.sql import types as T

from onceflow.analytics.schemas import spark_type
from onceflow.stages import Pipeline


@dataclass
class Counts:
    ok: int
    failed: int
    rate: float | None
    tags: list[str]


class Reading(TypedDict):
    device: str
    counts: Counts
    seen: dict[str, bool]


def test_scalars_and_spark_types() -> None:
    assert spark_type(int) == T.LongType()
    assert spark_type(float) == T.DoubleType()
    assert spark_type(str) == T.StringType()
    assert spark_type(bool) == T.BooleanType()
    assert spark_type(T.DecimalType(10, 2)) == T.DecimalType(10, 2)


def test_dataclass_and_typeddict_nest() -> None:
    counts = T.StructType([
        T.StructField("ok", T.LongType()), T.StructField("failed", T.LongType()),
        T.StructField("rate", T.DoubleType()), T.StructField("tags", T.ArrayType(T.StringType())),
    ])
    assert spark_type(Counts) == counts
    assert spark_type(Reading) == T.StructType([
        T.StructField("device", T.StringType()), T.StructField("counts", counts),
        T.StructField("seen", T.MapType(T.StringType(), T.BooleanType())),
    ])


@pytest.mark.parametrize("bad", [object, bytes, int | str, "int"])
def test_unsupported_types_are_named(bad: object) -> None:
    with pytest.raises(TypeError, match="expected a dataclass, a TypedDict"):
        spark_type(bad)


def test_the_aggregate_keeps_its_schema() -> None:
    pipeline = Pipeline("p", topics=("t",)).aggregate(
        "counts", key=str, init=lambda: {"ok": 0}, fold=lambda s, _: s, schema=Counts)
    assert pipeline.aggregates[0].schema is Counts
