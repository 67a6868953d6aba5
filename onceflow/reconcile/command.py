"""``onceflow reconcile -c app.conf [--stage ID] [--keys K ...] [--report DIR]
[--from-offsets earliest|committed-at:TS]``.

Exit codes: 0 every compared row equal (or gone by its expiry or retention); 1 a row
drifted, missing or unexpected; 2 it cannot decide (a configuration error, input not
readable or no longer retained, its order unknown, stored states ahead of the
committed offsets and different).
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onceflow.reconcile.compare import Entry
from onceflow.reconcile.cut import parse_from_offsets
from onceflow.reconcile.run import EXIT_UNDECIDED, Result, reconcile
from onceflow.runtime.config import ConfigError, load_settings, split_assignment

__all__ = ["cli", "print_result", "write_report"]

SHOWN = 50  # rows of differences printed; the report has them all
VERDICTS = ("equal", "expired", "drifted", "missing", "unexpected", "ahead", "not retained",
            "order unknown", "maybe restarted")


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="onceflow reconcile",
        description="Replay the pipeline's retained input up to its group's committed offsets "
                    "with the worker's own rules, and compare every stored state and history "
                    "row with the recomputed one. Exit 0: all equal; 1: drift; 2: cannot "
                    "decide.")
    parser.add_argument("-c", "--config", required=True, help="application HOCON file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, as for onceflow run (repeatable)")
    parser.add_argument("--stage", action="append", default=[], metavar="ID",
                        help="only this aggregate (repeatable; default: every one)")
    parser.add_argument("--keys", nargs="+", default=[], metavar="K", help="only these keys")
    parser.add_argument("--report", type=Path, metavar="DIR",
                        help="write reconcile.json and reconcile.html to DIR")
    parser.add_argument("--from-offsets", default="earliest", metavar="earliest|committed-at:TS",
                        help="earliest (default): replay from the log's head up to the group's "
                             "committed offsets; committed-at:TS: only up to the records "
                             "written by TS (ISO 8601, UTC without a zone, or epoch ms): the "
                             "states changed since are 'ahead'")
    parser.add_argument("--stall", type=float, default=60.0, metavar="S",
                        help="give up (exit 2) when the input stops arriving for S seconds")
    args = parser.parse_args(argv)
    from onceflow.runtime.wiring import load_pipeline

    try:
        cut_at = parse_from_offsets(args.from_offsets)
        overrides = dict(split_assignment(a) for a in args.set)
        settings = load_settings(args.config, overrides)
        pipeline = load_pipeline(settings)
        with _Progress() as progress:
            result = reconcile(settings, pipeline, args.stage, args.keys, progress.update,
                               args.stall, cut_at)
    except (ConfigError, ValueError) as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_UNDECIDED
    print_result(result)
    if args.report is not None:
        write_report(result, args.report)
    return result.exit_code


class _Progress:
    """A rich progress bar on stderr when rich is installed (an extra), else nothing."""

    def __enter__(self) -> _Progress:
        self._bar: Any = None
        try:
            from rich.console import Console
            from rich.progress import Progress
        except ImportError:
            return self
        self._bar = Progress(console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task("replaying the input", total=None)
        self._bar.start()
        return self

    def update(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _summary_rows(result: Result) -> list[list[str]]:
    return [[stage, *(f"{counts.get(v, 0):,}" for v in VERDICTS)]
            for stage, counts in result.counts.items()]


def _entry_rows(result: Result) -> list[list[str]]:
    return [[e.stage, e.key, "" if e.window is None else str(e.window), _said(e),
             _brief(e.stored), _brief(e.recomputed)] for e in result.entries[:SHOWN]]


def _said(entry: Entry) -> str:
    """The verdict, with the rule that let an expired row go, or the records a drifted
    state lacks."""
    if entry.rule is not None:
        return f"{entry.verdict}: {entry.rule}"
    if entry.records:
        more = f" (+{len(entry.records) - 3} more)" if len(entry.records) > 3 else ""
        return f"{entry.verdict}: lacks {'; '.join(entry.records[:3])}{more}"
    return entry.verdict


def _accounting_rows(result: Result) -> list[list[str]]:
    rows = [["input records read", f"{result.read:,}"]]
    rows += [[name, f"{n:,}"] for name, n in sorted(result.counters.items()) if name != "records"]
    rows += [[f"produced to {topic}", f"{n:,}"] for topic, n in sorted(result.sent.items())]
    return rows


def _brief(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _verdict(result: Result) -> str:
    code = result.exit_code
    offsets = ", ".join(f"{t}/{p}@{n}" for (t, p), n in sorted(result.horizon.committed.items()))
    line = f"reconciled up to the committed offsets of group {result.group!r}: {offsets}"
    if result.cut_at is not None:
        at = datetime.fromtimestamp(result.cut_at / 1000, UTC).isoformat()
        upto = ", ".join(f"{t}/{p}@{n}" for (t, p), n in sorted(result.until.items()))
        line = (f"reconciled up to the input written by {at}: {upto} (group {result.group!r} "
                f"committed {offsets})")
    if result.horizon.lag:
        line += f" ({result.horizon.lag:,} records past them not compared)"
    if result.unordered:
        line += ("\nthe merge log leaves unordered: " + "; ".join(result.unordered[:5])
                 + (" ..." if len(result.unordered) > 5 else ""))
    word = {0: "every row reconciles", 1: "DRIFT", 2: "cannot decide"}[code]
    expired = sum(1 for e in result.entries if e.verdict == "expired")
    if expired:
        word += f" ({expired:,} rows gone by their expiry or retention)"
    if result.problem:
        word += f": {result.problem}"
    return f"{line}\n{word} (exit {code}, {result.seconds:.1f} s)"


def print_result(result: Result, console: Any = None) -> None:
    """The tables and the verdict, on ``console`` (a rich Console; default: stdout)."""
    # a row per verdict, a column per stage: ten verdicts side by side do not fit a terminal
    stages = list(result.counts)
    tables = [(f"onceflow reconcile: {result.pipeline}", ["verdict", *stages],
               [[verdict, *(f"{result.counts[stage].get(verdict, 0):,}" for stage in stages)]
                for verdict in VERDICTS])]
    if result.entries:
        shown = min(SHOWN, len(result.entries))
        tables.append((f"rows that differ ({shown} of {len(result.entries)})",
                       ["stage", "key", "window", "verdict", "stored", "recomputed"],
                       _entry_rows(result)))
    tables.append(("every record accounted for (the replay's counters)", ["measure", "value"],
                   _accounting_rows(result)))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for title, columns, rows in tables:
            print(title)
            for row in [columns, *rows]:
                print("  " + " | ".join(row))
        print(_verdict(result))
        return
    console = console or Console(soft_wrap=True)
    for title, columns, rows in tables:
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    console.print(_verdict(result), markup=False)


def write_report(result: Result, directory: Path) -> None:
    """``reconcile.json`` (everything, every differing row) and ``reconcile.html``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "reconcile.json").write_text(json.dumps(result.as_dict(), indent=1,
                                                         default=str) + "\n")
    parts = [f"<h1>onceflow reconcile: {html.escape(result.pipeline)}</h1>",
             f"<pre>{html.escape(_verdict(result))}</pre>",
             _html_table(["stage", *VERDICTS], _summary_rows(result)),
             _html_table(["stage", "key", "window", "verdict", "stored", "recomputed"],
                         [[e.stage, e.key, "" if e.window is None else str(e.window), _said(e),
                           json.dumps(e.stored, default=str), json.dumps(e.recomputed,
                                                                         default=str)]
                          for e in result.entries]),
             _html_table(["measure", "value"], _accounting_rows(result))]
    (directory / "reconcile.html").write_text(
        "<!doctype html><meta charset=utf-8><title>onceflow reconcile</title>"
        "<style>td,th{border:1px solid #ccc;padding:2px 6px}table{border-collapse:collapse;"
        "margin:1em 0}</style>" + "\n".join(parts) + "\n")


def _html_table(columns: list[str], rows: Iterable[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
