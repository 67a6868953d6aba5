"""``onceflow services up|down|status``: local services recorded in a state directory.

``make services-up`` and developers use it to keep a broker, Redis and
Cassandra running between commands; each service's pid, port and log are
recorded in ``<state-dir>/services.json``, so ``down`` and ``status`` work
from any later process. Starting and probing one service is
:mod:`onceflow.devtools.services`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from onceflow.devtools.services import (
    ServiceError,
    ServiceInfo,
    is_up,
    owned,
    port_is_free,
    start_cassandra,
    start_redis,
    start_tansu,
    stop,
)

NAMES = ("kafka", "redis", "cassandra")
DEFAULT_PORTS = {"kafka": 9092, "redis": 6379, "cassandra": 9042}

STARTERS: dict[str, Callable[[Path, int | None], ServiceInfo]] = {
    "kafka": start_tansu, "redis": start_redis, "cassandra": start_cassandra,
}


class ServicesManager:
    """Services for one state directory, recorded in ``state_dir/services.json``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.state_file = state_dir / "services.json"

    def _load(self) -> dict[str, ServiceInfo]:
        try:
            raw: dict[str, dict[str, Any]] = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return {name: ServiceInfo(**{**rec, "log": Path(rec["log"])}) for name, rec in raw.items()}

    def _save(self, infos: dict[str, ServiceInfo]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        raw = {name: {**asdict(info), "log": str(info.log)} for name, info in infos.items()}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(raw, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    def up(self, names: Iterable[str] = NAMES,
           ports: dict[str, int] | None = None) -> dict[str, ServiceInfo]:
        """Start what is not running (default port if free, else any); reuse what is."""
        recorded = self._load()
        result: dict[str, ServiceInfo] = {}
        for name in _check_names(names):
            current = recorded.get(name)
            if current is not None and owned(current) and not is_up(current):
                stop(current)  # alive but not answering (frozen, hung): replace it
            if current is None or not is_up(current):
                wanted = (ports or {}).get(name) or DEFAULT_PORTS[name]
                port = wanted if (ports and name in ports) or port_is_free(wanted) else None
                current = STARTERS[name](self.state_dir / name, port)
                recorded[name] = current
                self._save(recorded)
            result[name] = current
        return result

    def down(self, names: Iterable[str] = NAMES) -> None:
        """Stop the named services recorded here and forget them."""
        recorded = self._load()
        for name in _check_names(names):
            info = recorded.pop(name, None)
            if info is not None and owned(info):
                stop(info)
            self._save(recorded)

    def status(self, names: Iterable[str] = NAMES) -> dict[str, ServiceInfo | None]:
        """Each named service's info if it is up, else None."""
        recorded = self._load()
        result: dict[str, ServiceInfo | None] = {}
        for name in _check_names(names):
            info = recorded.get(name)
            result[name] = info if info is not None and is_up(info) else None
        return result


def _check_names(names: Iterable[str]) -> list[str]:
    chosen = list(names)
    unknown = sorted(set(chosen) - set(NAMES))
    if unknown:
        raise ServiceError(f"unknown service(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return chosen


def cli(argv: list[str]) -> int:
    """``onceflow services up|down|status [--state-dir DIR] [--only kafka,redis]``.

    *argv* is what follows ``services`` on the command line; returns the exit code.
    """
    if argv[:1] == ["services"]:
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="onceflow services",
                                     description="local kafka/redis/cassandra")
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--state-dir", type=Path, default=Path.cwd() / ".state" / "services")
    parser.add_argument("--only", default=",".join(NAMES), help="comma-separated subset")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    manager = ServicesManager(args.state_dir)
    try:
        if args.action == "up":
            shown: dict[str, ServiceInfo | None] = dict(manager.up(names))
        elif args.action == "down":
            manager.down(names)
            shown = dict.fromkeys(_check_names(names))
        else:
            shown = manager.status(names)
    except ServiceError as exc:
        print(f"onceflow services {args.action}: {exc}", file=sys.stderr)
        return 1
    for name, info in shown.items():
        where = f"{info.address:<16}(pid {info.pid})" if info else "not running"
        print(f"{name:<10}{where}")
    return 0
