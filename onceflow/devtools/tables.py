"""The two-column "measure | value" tables the demo and chaos runs end with."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table


def measures(title: str, rows: Iterable[tuple[str, str]]) -> Table:
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    return table
