"""Charts (matplotlib, headless) and the one-page HTML page of the robots report job."""

from __future__ import annotations

import html
import itertools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onceflow.analytics.overview_report import html_table, save_figure

__all__ = ["draw_charts", "write_html"]

Rows = Sequence[Mapping[str, Any]]


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def draw_charts(results: Mapping[str, Rows], fine_stage: str, k: float, folder: Path
                ) -> dict[str, Path]:
    """fleet_trend.png, top_failing.png, anomalies.png; returns name -> path."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    # Untyped handles: matplotlib's stubs take no datetimes, which it plots fine.
    mdates: Any = importlib.import_module("matplotlib.dates")
    plt: Any = importlib.import_module("matplotlib.pyplot")

    folder.mkdir(parents=True, exist_ok=True)
    charts: dict[str, Path] = {}
    fleet = sorted((r for r in results["fleet_windows"] if r["stage"] == fine_stage),
                   key=lambda r: r["window_start"])
    hourly = sorted(results["hourly_trend"], key=lambda r: r["hour_start"])

    def time_axis(axis: Any) -> None:
        locator = mdates.AutoDateLocator(tz=UTC)
        axis.xaxis.set_major_locator(locator)
        axis.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))

    # 1. Fleet trend: failure rate per window and per hour, events per window.
    fig, rate_axis = plt.subplots(figsize=(11, 5))
    count_axis = rate_axis.twinx()
    if fleet:
        times = [_time(r["window_start"]) for r in fleet]
        width = _bar_width(fleet)
        count_axis.bar(times, [r["total"] for r in fleet], width=width, align="edge",
                       color="#c8d3e0", label="events per window (right axis)")
        rate_axis.plot([t + (width / 2) for t in times],
                       [100 * r["failure_rate"] for r in fleet], color="#d62728",
                       marker=".", label="fleet failure rate per window")
    if hourly:
        rate_axis.step([_time(r["hour_start"]) for r in hourly] + [_time(
            hourly[-1]["hour_start"] + 3_600_000)],
            [100 * r["failure_rate"] for r in hourly] + [100 * hourly[-1]["failure_rate"]],
            where="post", color="#1f4e79", linewidth=2.5, label="fleet failure rate per hour")
    rate_axis.set_zorder(count_axis.get_zorder() + 1)
    rate_axis.patch.set_visible(False)
    rate_axis.set_xlabel("window start (UTC)")
    rate_axis.set_ylabel("failure rate (%)")
    count_axis.set_ylabel("fastening events")
    rate_axis.set_ylim(bottom=0)
    if fleet:  # the hourly steps are clipped to the windows' span
        pad = (_time(fleet[-1]["window_start"]) - _time(fleet[0]["window_start"])) * 0.03
        rate_axis.set_xlim(_time(fleet[0]["window_start"]) - pad,
                           _time(fleet[-1]["window_start"]) + _bar_width(fleet) + pad)
    time_axis(rate_axis)
    rate_axis.set_title(f"Fleet trend ({fine_stage})")
    handles = rate_axis.get_legend_handles_labels()
    more = count_axis.get_legend_handles_labels()
    fig.legend(handles[0] + more[0], handles[1] + more[1], loc="lower center", ncol=3,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    charts["fleet_trend"] = _save(fig, folder / "fleet_trend.png")

    # 2. Top failing robots: failures (bars) and failure rate (labels).
    top = list(results["top_failing"])
    fig, axis = plt.subplots(figsize=(9, 0.45 * max(len(top), 4) + 1.5))
    names = [r["robot"] for r in top][::-1]
    failed = [r["failed"] for r in top][::-1]
    ok = [r["ok"] for r in top][::-1]
    axis.barh(names, failed, color="#d62728", label="failed")
    axis.barh(names, ok, left=failed, color="#9fd39f", label="ok")
    for y, row in enumerate(top[::-1]):
        axis.text(row["total"], y, f" {100 * row['failure_rate']:.0f}% failed",
                  va="center", fontsize=8)
    axis.set_xlabel("fastening results (failed + ok)")
    axis.set_ylabel("robot")
    axis.set_title(f"Top {len(top)} robots by failures ({fine_stage})")
    axis.legend(loc="lower right", fontsize=8)
    axis.set_xlim(right=max([r["total"] for r in top], default=1) * 1.25)
    fig.tight_layout()
    charts["top_failing"] = _save(fig, folder / "top_failing.png")

    # 3. Anomaly timeline: each anomaly's rate against the window's mean and mean + k std.
    stats = sorted(results["window_stats"], key=lambda r: r["window_start"])
    anomalies = results["anomalies"]
    fig, axis = plt.subplots(figsize=(11, 5))
    if stats:
        times = [_time(r["window_start"]) for r in stats]
        axis.plot(times, [100 * r["mean_rate"] for r in stats], color="#1f4e79",
                  label="mean robot failure rate")
        axis.plot(times, [100 * (r["mean_rate"] + k * (r["std_rate"] or 0.0)) for r in stats],
                  color="#ff7f0e", linestyle="--", label=f"mean + {k:g} std (threshold)")
    if anomalies:
        axis.scatter([_time(r["window_start"]) for r in anomalies],
                     [100 * r["failure_rate"] for r in anomalies],
                     s=[12 + 6 * r["total"] for r in anomalies], color="#d62728", alpha=0.7,
                     edgecolor="black", linewidth=0.4,
                     label=f"anomalous robot ({len(anomalies)}; size = events)")
    axis.set_xlabel("window start (UTC)")
    axis.set_ylabel("failure rate (%)")
    axis.set_ylim(bottom=0)
    time_axis(axis)
    axis.set_title(f"Anomalies: robots more than {k:g} std above the window mean ({fine_stage})")
    fig.legend(*axis.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    charts["anomalies"] = _save(fig, folder / "anomalies.png")
    return charts


def _bar_width(rows: Rows) -> Any:
    from datetime import timedelta

    starts = sorted({r["window_start"] for r in rows})
    step = min((b - a for a, b in itertools.pairwise(starts)), default=60_000)
    return timedelta(milliseconds=step * 0.9)


def _save(fig: Any, path: Path) -> Path:
    return save_figure(fig, path, dpi=110)


def write_html(path: Path, summary: Mapping[str, Any], results: Mapping[str, Rows],
               charts: Mapping[str, Path], tables: Mapping[str, Path]) -> Path:
    """One page: the summary, the three charts, top failing and strongest anomalies."""
    e = html.escape
    fine = summary["fine_stage"]

    def table(rows: Rows, columns: Sequence[str]) -> str:
        return html_table(rows, columns, _cell)

    stages = [{"stage": s, **v, "failure_rate": v["failed"] / max(1, v["ok"] + v["failed"])}
              for s, v in summary["stages"].items()]
    strongest = sorted(results["anomalies"], key=lambda r: -r["z"])[:20]
    since, until = summary["since_ms"], summary["until_ms"]
    period = ("all" if since is None and until is None else
              f"starting from {_cell('window_start', since) if since is not None else 'the first'}"
              f" until {_cell('window_start', until) if until is not None else 'the last'}")
    images = "".join(
        f'<figure><a href="{e(p.relative_to(path.parent).as_posix())}">'
        f'<img src="{e(p.relative_to(path.parent).as_posix())}" alt="{e(n)}"></a>'
        f"<figcaption>{e(n)}</figcaption></figure>" for n, p in charts.items())
    links = "".join(f'<li><a href="{e(p.relative_to(path.parent).as_posix())}">{e(n)}</a>'
                    f" (Parquet)</li>" for n, p in tables.items())
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>onceflow analytics</title>
<style>body{{font-family:sans-serif;max-width:1150px;margin:1em auto}}
table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:2px 8px;
text-align:right}}img{{max-width:100%}}figure{{margin:1em 0}}</style></head><body>
<h1>onceflow analytics: robot fastenings</h1>
<p>Source: {e(str(summary['source']))}. Windows: {e(period)}. Anomaly threshold: failure
rate more than {summary['anomaly_k']:g} standard deviations above the mean of robots with at
least {summary['min_events']} events in the window ({e(fine)}).</p>
<h2>Per stage</h2>
{table(stages, ["stage", "robots", "windows", "closed_windows", "ok", "failed",
                "failure_rate"])}
<h2>Charts</h2>{images}
<h2>Top {len(results['top_failing'])} robots by failures</h2>
{table(results['top_failing'], ["robot", "failed", "ok", "total", "failure_rate", "windows"])}
<h2>Strongest anomalies ({summary['anomalies']} in all)</h2>
{table(strongest, ["window_start", "robot", "failed", "total", "failure_rate", "mean_rate",
                   "std_rate", "z"])}
<h2>Tables</h2><ul>{links}</ul>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in ("window_start", "hour_start") or column.endswith("_ms"):
        return _time(int(value)).strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if "rate" in column else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
