"""Charts (matplotlib, headless) and the HTML page of the generic report.

Per stage: the distribution of each numeric field (a box from the
percentiles: whiskers at min and max, box 25-75%, line at the median, a dot at
the mean), the top keys by each field, and for windowed stages keys and
field totals per window over time. At most ``MAX_FIELDS`` fields per chart.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["MAX_FIELDS", "draw_charts", "write_html"]

MAX_FIELDS = 6
Rows = Sequence[Mapping[str, Any]]
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def draw_charts(tables: Mapping[str, Rows], folder: Path) -> dict[str, Path]:
    """``<stage>-distribution``, ``<stage>-top`` and ``<stage>-over-time`` charts."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    mdates: Any = importlib.import_module("matplotlib.dates")
    folder.mkdir(parents=True, exist_ok=True)
    charts: dict[str, Path] = {}
    for stage in [r["stage"] for r in tables["stages"]]:
        name = _SAFE.sub("_", stage)
        dist = [r for r in tables["distributions"] if r["stage"] == stage][:MAX_FIELDS]
        if dist:
            fig, axes = plt.subplots(1, len(dist), figsize=(2.6 * len(dist) + 1, 4),
                                     squeeze=False)
            for axis, r in zip(axes[0], dist, strict=True):
                axis.bxp([{"whislo": r["min"], "q1": r["p25"], "med": r["p50"], "q3": r["p75"],
                           "whishi": r["max"], "mean": r["mean"], "fliers": [],
                           "label": r["field"]}], showmeans=True)
                axis.set_title(f"{r['field']} (n={r['count']:,})", fontsize=9)
            per = "key and window" if _windowed(tables, stage) else "key"
            fig.suptitle(f"Distribution per {per} ({stage})")
            fig.tight_layout()
            charts[f"{stage}-distribution"] = save_figure(fig, folder / f"{name}-distribution.png")
        fields = [r["field"] for r in dist]
        if fields:
            top = [r for r in tables["top_keys"] if r["stage"] == stage]
            longest = max([sum(1 for r in top if r["field"] == f) for f in fields], default=1)
            fig, axes = plt.subplots(1, len(fields), figsize=(3.6 * len(fields) + 1,
                                                              0.35 * max(longest, 4) + 1.5),
                                     squeeze=False)
            for axis, f in zip(axes[0], fields, strict=True):
                rows = [r for r in top if r["field"] == f][::-1]
                axis.barh([r["key"] for r in rows], [r["total"] for r in rows], color="#1f77b4")
                axis.set_title(f"top keys by {f}", fontsize=9)
                axis.tick_params(axis="y", labelsize=7)
            fig.suptitle(f"Top keys ({stage})")
            fig.tight_layout()
            charts[f"{stage}-top"] = save_figure(fig, folder / f"{name}-top.png")
        series = [r for r in tables["over_time"] if r["stage"] == stage]
        if series:
            fig, axes = plt.subplots(1 + len(fields), 1, figsize=(11, 2.2 * (1 + len(fields))
                                                                  + 1),
                                     sharex=True, squeeze=False)
            keys = {r["window_start"]: r["keys"] for r in series}
            starts = sorted(keys)
            axes[0][0].plot([_time(s) for s in starts], [keys[s] for s in starts],
                            color="#555555", marker=".")
            axes[0][0].set_ylabel("keys")
            for axis, f in zip((a[0] for a in axes[1:]), fields, strict=True):
                points = sorted((r["window_start"], r["total"]) for r in series
                                if r["field"] == f and r["total"] is not None)
                axis.plot([_time(s) for s, _ in points], [t for _, t in points], marker=".")
                axis.set_ylabel(f"{f} total", fontsize=8)
            locator = mdates.AutoDateLocator(tz=UTC)
            last = axes[-1][0]
            last.xaxis.set_major_locator(locator)
            last.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
            windowed = _windowed(tables, stage)
            last.set_xlabel("window start (UTC)" if windowed else "time of the landed states (UTC)")
            fig.suptitle(f"Per window ({stage})" if windowed else f"Over time ({stage})")
            fig.tight_layout()
            charts[f"{stage}-over-time"] = save_figure(fig, folder / f"{name}-over-time.png")
    return charts


def _windowed(tables: Mapping[str, Rows], stage: str) -> bool:
    return any(r["windowed"] for r in tables["stages"] if r["stage"] == stage)


def save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Write a chart and free it (pyplot keeps every open figure otherwise)."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def html_table(rows: Rows, columns: Sequence[str],
               cell: Callable[[str, Any], str]) -> str:
    """An HTML table of ``columns`` of ``rows``, each value shown by ``cell`` and escaped."""
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{e(cell(c, r.get(c)))}</td>" for c in columns)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def write_html(path: Path, summary: Mapping[str, Any], tables: Mapping[str, Rows],
               charts: Mapping[str, Path], files: Mapping[str, Path]) -> Path:
    """One page: the stages, then per stage its distributions, top keys and charts."""
    e = html.escape

    def table(rows: Rows, columns: Sequence[str]) -> str:
        return html_table(rows, columns, _cell)

    def link(p: Path) -> str:
        return e(p.relative_to(path.parent).as_posix())

    sections = []
    for stage in [r["stage"] for r in tables["stages"]]:
        names = [f"{stage}-{kind}" for kind in ("distribution", "top", "over-time")]
        images = "".join(f'<figure><a href="{link(charts[n])}"><img src="{link(charts[n])}" '
                         f'alt="{e(n)}"></a><figcaption>{e(n)}</figcaption></figure>'
                         for n in names if n in charts)
        top = [r for r in tables["top_keys"] if r["stage"] == stage]
        sections.append(
            f"<h2>{e(stage)}</h2>"
            + table([r for r in tables["distributions"] if r["stage"] == stage],
                    ["field", "count", "min", "mean", "max", "p25", "p50", "p75", "p95"])
            + (table(top, ["field", "rank", "key", "total", "rows"]) if top else "")
            + images)
    links = "".join(f'<li><a href="{link(p)}">{e(n)}</a> (Parquet)</li>'
                    for n, p in files.items())
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>onceflow analytics</title>
<style>body{{font-family:sans-serif;max-width:1150px;margin:1em auto}}
table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:2px 8px;
text-align:right}}img{{max-width:100%}}figure{{margin:1em 0}}</style></head><body>
<h1>onceflow analytics: pipeline {e(str(summary['pipeline']))}</h1>
<p>Every aggregate stage as stored: keys, the distribution of each numeric field of the
values, the top {summary['top_n']} keys by each field, and windows over time.</p>
{table(tables['stages'], ["stage", "windowed", "keys", "rows", "windows", "closed",
                          "fields"])}
{''.join(sections)}
<h2>Tables</h2><ul>{links}</ul>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column.startswith("window_"):
        return _time(int(value)).strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() else f"{value:,.3f}"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
