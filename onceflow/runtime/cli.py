"""The ``onceflow`` command: run a worker, manage local services, run the demo.

Exit codes: 0 done, 1 failed at run time, 2 bad configuration or usage.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from onceflow.runtime.config import ConfigError, load_settings

EXIT_CONFIG = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    command: str = args.command
    if command == "run":
        return _run(args.config, args.set)
    if command == "services":
        from onceflow.runtime import services

        return services.cli(args.rest)
    if command == "demo":
        from onceflow.runtime import demo

        return demo.cli(args.rest)
    raise AssertionError(command)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the worker until SIGTERM")
    run.add_argument("-c", "--config", required=True, help="application HOCON file")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. onceflow.kafka.group-id=g1 (repeatable)",
    )
    for name, text in (("services", "start/stop local broker, Redis, Cassandra"),
                       ("demo", "the robot demo: kills and restarts, then checks totals")):
        cmd = sub.add_parser(name, help=text, add_help=False)
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _run(config: str, assignments: list[str]) -> int:
    from onceflow.runtime.worker import Worker, check_stores, load_pipeline

    log = logging.getLogger("onceflow")
    try:
        overrides = dict(_split(a) for a in assignments)
        settings = load_settings(config, overrides)
        pipeline = load_pipeline(settings)
        check_stores(settings, pipeline)
    except ConfigError as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    worker = Worker(settings, pipeline)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        worker.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.start()
    return worker.run()


def _split(assignment: str) -> tuple[str, str]:
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        print(f"onceflow: --set expects KEY=VALUE, got {assignment!r}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    return key.strip(), value
