"""An aggregate's declared value type as a Spark type, so analytics need not guess.

``Pipeline.aggregate(..., schema=...)`` accepts a dataclass, a TypedDict, a
Spark ``DataType`` or one of ``int``, ``float``, ``str``, ``bool``. Inference
(``frames.typed`` without a schema) reads every value once more and gives up
on values that are not flat; a declared type is read as declared, nested
dataclasses, lists and dicts included, and a field missing from a value is
null. A value that does not match its declared type becomes null in the typed
columns and stays whole in ``value_json``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

__all__ = ["spark_type"]


def spark_type(declared: Any) -> Any:
    """The Spark ``DataType`` of ``declared`` (module docstring); TypeError if unsupported."""
    from pyspark.sql import types as T

    if isinstance(declared, T.DataType):
        return declared
    scalars: dict[Any, Any] = {bool: T.BooleanType(), int: T.LongType(),
                               float: T.DoubleType(), str: T.StringType()}
    if declared in scalars:
        return scalars[declared]
    origin = get_origin(declared)
    if origin in (Union, types.UnionType):
        present = [a for a in get_args(declared) if a is not type(None)]
        if len(present) == 1:  # Optional[X]: every column is nullable anyway
            return spark_type(present[0])
    if origin in (list, tuple, typing.Sequence) and get_args(declared):
        return T.ArrayType(spark_type(get_args(declared)[0]))
    if origin is dict and get_args(declared):
        key, value = get_args(declared)
        return T.MapType(spark_type(key), spark_type(value))
    record = dataclasses.is_dataclass(declared) or is_typeddict(declared)
    if isinstance(declared, type) and record:
        hints = get_type_hints(declared)
        return T.StructType([T.StructField(name, spark_type(hint), nullable=True)
                             for name, hint in hints.items()])
    raise TypeError(f"schema {declared!r}: expected a dataclass, a TypedDict, a Spark "
                    "DataType, or int/float/str/bool (lists, dicts and Optional of those)")
