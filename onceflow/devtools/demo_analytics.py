"""The analytics step of ``make demo``: windowed robot data under SIGKILL, then Spark.

The demo's own pipeline keeps one running total per robot; analytics needs
windows, so this step runs the windowed robot pipeline (republisher +
per-minute and per-day windows, ``onceflow.examples.robot_chain``) through
``onceflow chaos`` machinery with a few SIGKILLs and the landing zone on,
checks it is exact, then runs ``onceflow analytics`` with the robots report job
(``onceflow.examples.robots_report``) over the Redis store.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from onceflow.analytics.cli import run_analytics
from onceflow.devtools.chaos import ChaosOptions, run_chaos
from onceflow.devtools.harness import packaged_config
from onceflow.examples import robots_report
from onceflow.examples.robot_chain import build_windows
from onceflow.runtime.config import load_settings

__all__ = ["run_demo_analytics"]


def run_demo_analytics(bootstrap: str, redis_url: str, state: Path, console: Console,
                       messages: int = 12_000, kills: int = 3, seed: int = 7
                       ) -> robots_report.JobResult:
    prefix = f"demo-analytics-{seed}"
    landing = state / "landing"
    store_settings = {"onceflow.stores.redis.url": redis_url,
                      "onceflow.stores.redis.key-prefix": prefix}
    console.rule("analytics: windowed robot pipeline, then Spark")
    console.print(f"producing {messages:,} reports through the republisher and the windowed "
                  f"aggregator ({kills} SIGKILLs), landing zone {landing}")
    report = run_chaos(
        ChaosOptions(messages=messages, duration=8.0, kills=kills, seed=seed, store="redis"),
        bootstrap=bootstrap, workdir=state, console=console,
        store_settings={**store_settings, "onceflow.landing.dir": str(landing)})
    if not report.exact:
        raise RuntimeError(f"windowed run not exact: {report}")
    console.print(f"windows exact after {sum(report.kills.values())} SIGKILLs: "
                  f"{report.windows} windows, lost {report.lost}, double {report.double}")
    settings = load_settings(packaged_config("demo.conf"), {
        "onceflow.stores.redis.url": f'"{redis_url}"',
        "onceflow.stores.redis.key-prefix": f'"{prefix}"',
        "onceflow.landing.dir": f'"{landing}"',
        "onceflow.analytics.spark.master": '"local[*]"',
        "onceflow.analytics.spark.ui-enabled": "false",
    })
    result: robots_report.JobResult = run_analytics(
        settings, build_windows("unused", "redis"), out=state / "analytics", console=console,
        job=robots_report.report)
    console.print(robots_report.summary_table(result))
    return result
