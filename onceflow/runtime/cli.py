"""The ``onceflow`` command: run a worker, write a starter project (new); services, demo,
chaos and analytics with extras.

Exit codes: 0 done, 1 failed at run time, 2 bad configuration or usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from onceflow import faults
from onceflow.runtime import extras
from onceflow.runtime.app_path import take_app_dir, use_app_dir
from onceflow.runtime.config import ConfigError, load_settings
from onceflow.runtime.stop import StopSignals

EXIT_OK = 0
EXIT_CONFIG = 2
log = logging.getLogger("onceflow")
# Subcommands that come with an extra (onceflow.devtools, onceflow.analytics).
TOOLS = {"services": "embedded", "demo": "embedded", "chaos": "embedded",
         "analytics": "analytics"}


def main(argv: Sequence[str] | None = None) -> int:
    try:  # the user's pipeline module is found as `python -m` finds it (app_path)
        argv, directory = take_app_dir(list(sys.argv[1:] if argv is None else argv))
    except ValueError as error:
        print(f"onceflow: {error}", file=sys.stderr)
        return EXIT_CONFIG
    use_app_dir(directory)
    verbose = bool(argv) and argv[0] in ("-v", "--verbose")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    rest = argv[1:] if verbose else argv
    # These subcommands own their argument parsing (and --help).
    if rest and rest[0] == "status":
        from onceflow.runtime import status

        return status.cli(rest[1:])
    if rest and rest[0] == "states":
        from onceflow.runtime import states

        return states.cli(rest[1:])
    if rest and rest[0] == "new":
        from onceflow.runtime import new_project

        return new_project.cli(rest[1:])
    if rest and rest[0] == "forget":
        from onceflow.runtime import forget

        return forget.cli(rest[1:])
    if rest and rest[0] == "reconcile":
        from onceflow.reconcile import command

        return command.cli(rest[1:])
    if rest and rest[0] in TOOLS:
        return _tool(rest[0], rest[1:])
    args = _parser().parse_args(argv)
    return _run(args.config, args.set)


def _tool(command: str, argv: list[str]) -> int:
    """Run a subcommand that lives in an extra, or say which extra to install (exit 2)."""
    needed = [TOOLS[command]]
    if command == "demo" and "--no-analytics" not in argv:  # the demo ends with Spark
        needed.append("analytics")
    for extra in needed:
        absent = extras.missing_extra(extra)
        if absent:
            hint = extras.install_hint(f"onceflow {command}", extra)
            if extra != TOOLS[command]:
                hint += " (or skip that step with --no-analytics)"
            print(f"onceflow: {hint}; missing: {', '.join(absent)}", file=sys.stderr)
            return EXIT_CONFIG
    if command == "services":
        from onceflow.devtools import services_manager

        return services_manager.cli(argv)
    if command == "demo":
        from onceflow.devtools import demo

        return demo.cli(argv)
    if command == "chaos":
        from onceflow.devtools import chaos

        return chaos.cli(argv)
    from onceflow.analytics import cli as analytics

    return analytics.cli(argv)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--app-dir", metavar="DIR", help="import the pipeline module from DIR "
                        "(default: the current directory, as python -m does); any subcommand")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the worker until SIGTERM")
    run.add_argument("-c", "--config", required=True, help="application HOCON file")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. onceflow.kafka.group-id=g1 (repeatable)",
    )
    sub.add_parser("new", help="write a starter project to ./NAME (pipeline, config, test) "
                   "and print the commands to run it")
    sub.add_parser("services", help="up|down|status of a local broker, Redis, Cassandra")
    sub.add_parser("demo", help="the robot demo: SIGKILLs and restarts, then checks totals")
    sub.add_parser("status", help="lag per input partition (--wait: until caught up), and "
                   "a running worker's /health and /metrics")
    sub.add_parser("states", help="print an aggregate stage's persisted states as JSON lines")
    sub.add_parser("forget", help="drop a re-created root topic's old watermarks and log "
                   "marks from the stores (--topic T), so its new events are counted")
    sub.add_parser("reconcile", help="replay the retained input up to the committed offsets "
                   "and compare every stored state and history row (exit 0 equal, 1 drift)")
    sub.add_parser("chaos", help="republisher + windowed aggregator under SIGKILL, verified")
    sub.add_parser("analytics", help="Spark over the persisted aggregates: a generic report "
                   "(keys, distributions, top keys, windows; charts, HTML), or --job "
                   "module:function (--follow: streaming)")
    return parser


def _run(config: str, assignments: list[str]) -> int:
    # Handlers first: loading the worker's modules takes about a second, and
    # a SIGTERM meanwhile would take the default action (killed, exit -15).
    signals = StopSignals().install()
    if stray := faults.set_in(os.environ):  # test-only switches: never silently ignored
        print(f"onceflow: config error: {', '.join(stray)} set: fault switches are for tests "
              "only (python -m onceflow.devtools.fault_worker); unset it to run the worker",
              file=sys.stderr)
        return EXIT_CONFIG
    from onceflow.runtime.expiry_check import check_retention
    from onceflow.runtime.join_setup import check_join_topics
    from onceflow.runtime.preflight import check_side_topics
    from onceflow.runtime.wiring import (
        check_exclusive,
        check_landing,
        check_store_access,
        check_stores,
        check_topic_names,
        load_pipeline,
    )
    from onceflow.runtime.worker import Worker

    try:
        overrides = dict(_split(a) for a in assignments)
        settings = load_settings(config, overrides)
        signals.budget = settings.shutdown.timeout
        for warning in settings.warnings:
            log.warning("config: %s", warning)
        pipeline = load_pipeline(settings)
        check_topic_names(settings, pipeline)
        check_stores(settings, pipeline)
        check_landing(settings, pipeline)
        check_exclusive(settings, pipeline)
        check_store_access(settings, pipeline)
        check_side_topics(settings, pipeline)  # before any actor: no group join
        check_join_topics(settings, pipeline)  # co-partitioned, or exit 2
        check_retention(settings, pipeline)  # warns only
    except ConfigError as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if signals.stopping():
        log.info("stop requested while loading: no actor was built")
        return EXIT_OK
    worker = Worker(settings, pipeline)
    try:  # binds the metrics port first: taken, it fails before any actor or thread
        worker.start()
    except ConfigError as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    return worker.run(signals.stopping, signals.exit_within)


def _split(assignment: str) -> tuple[str, str]:
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        print(f"onceflow: --set expects KEY=VALUE, got {assignment!r}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    return key.strip(), value
