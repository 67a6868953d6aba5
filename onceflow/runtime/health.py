"""HTTP endpoint of a running worker: ``/metrics`` (Prometheus) and ``/health`` (JSON).

``/health`` answers 200 while the supervisor runs the pipeline and progress
is being made, and 503 with the reasons (``reasons`` in the JSON) when the
supervisor has escalated, a child is restarting or the same failure keeps
coming back (a restart loop), the core was fenced lately, the consumer's
group join has taken longer than ``join_timeout``, records wait while
nothing was committed for ``stall_timeout`` seconds, or the outbox holds
records and commits wait for them. The lag is the group's, read from Kafka
off the request path (``onceflow.runtime.lag.LagWatch``), as ``onceflow
status`` reads it: not the worker's own counters, which stop with it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler
from onceflow.stores.fencing import Fenced

log = logging.getLogger(__name__)

Status = Callable[[], dict[str, Any]]


class HealthServer:
    """Serves ``/metrics`` and ``/health`` on a daemon thread."""

    def __init__(self, host: str, port: int, status: Status, pipeline: str = ""):
        """Binds the port (OSError when taken); serves nothing before ``start``.
        ``pipeline``: the pipeline's id, a ``pipeline`` label on every metric."""
        handler = _handler(status, metrics.Labelled({"pipeline": pipeline}))
        self._server = ThreadingHTTPServer((host, port), handler)
        self.port = self._server.server_address[1]
        self._on_fatal: FatalHandler | None = None
        self._thread = threading.Thread(target=self._serve, name="onceflow-http", daemon=True)

    def start(self, on_fatal: FatalHandler) -> HealthServer:
        """Serve; a server that dies reports to ``on_fatal`` (the worker then stops)."""
        self._on_fatal = on_fatal
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            self._server.serve_forever()
        except BaseException as error:
            if self._on_fatal is not None:
                self._on_fatal("http", error)
            raise

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(status: Status, exported: metrics.Labelled) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                names = parse_qs(query).get("name[]")  # prometheus_client's restriction
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(
                    exported if names is None else exported.restricted(names)))
            elif path == "/health":
                report = status()
                code = 200 if report["healthy"] else 503
                self._send(code, "application/json", json.dumps(report).encode())
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /health\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would drown the worker's log

    return Handler


def health_report(pipeline_id: str, children: dict[str, Any], consumer: dict[str, Any] | None,
                  escalated: str | None, stall_timeout: float,
                  lag: dict[str, Any] | None = None, looping: dict[str, Any] | None = None,
                  last_failure: tuple[str, BaseException, float] | None = None,
                  ) -> dict[str, Any]:
    """What /health reports: healthy or not and why, per-child state, the group's lag
    (``lag``: ``LagWatch.report()``), progress, commits and the restart loop if any."""
    reasons: list[str] = []
    if escalated is not None:
        reasons.append(f"escalated: {escalated}")
    if looping is not None:
        reasons.append(f"restart loop: {looping['child']} failed {looping['repeats']} times "
                       f"in a row with {looping['error']}, nothing committed in between")
    if not children:
        reasons.append("not started")
    elif escalated is None:
        waiting = {k: v for k, v in children.items() if v != "running"}
        if waiting:
            reasons.append("not running: " + ", ".join(f"{k} {v}" for k, v in waiting.items()))
    if last_failure is not None and last_failure[2] < stall_timeout \
            and _fenced(last_failure[1]) is not None:
        reasons.append(f"fenced {last_failure[2]:.0f}s ago: {_fenced(last_failure[1])}")
    if consumer and consumer["join_overdue"]:
        reasons.append(f"not assigned: the group join has taken {consumer['joining_seconds']}s "
                       f"(join-timeout {consumer['join_timeout']}s)")
    idle = metrics.seconds_since_progress()
    total = None if lag is None else lag.get("lag")
    # Behind: records wait on this worker's partitions (the group's, if it does
    # not know them), so a member whose partitions are caught up stays healthy.
    behind = None if lag is None else lag.get("assigned", total)
    since_commit = metrics.seconds_since_commit()
    stalled = bool(behind) and since_commit > stall_timeout
    if stalled:
        reasons.append(f"behind and not committing: lag {behind}, nothing committed for "
                       f"{since_commit:.0f}s (stall-timeout {stall_timeout:g}s)")
    # Records the broker does not take (e.g. an unreachable dead-letter topic) wait in
    # the outbox, and commits with them: processing goes on, so say it here.
    outbox = metrics.outbox_records()
    held = outbox > 0 and since_commit > stall_timeout
    if held:
        reasons.append(f"commits held: {outbox} records wait in the outbox, nothing "
                       f"committed for {since_commit:.0f}s")
    return {
        "healthy": not reasons,
        "reasons": reasons,
        "pipeline": pipeline_id,
        "children": children,
        "consumer": consumer,
        "escalated": escalated,
        "restart_loop": looping,
        "seconds_since_progress": round(idle, 3),
        "lag": total,
        "lag_read": lag,
        "stalled": stalled,
        "outbox": outbox,
        "seconds_since_commit": round(since_commit, 3),
        "commits_held": held,
    }


def _fenced(error: BaseException | None) -> Fenced | None:
    """The Fenced error behind a failure, if one is (causes and restart loops followed)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, Fenced):
            return error
        nested = getattr(error, "error", None)
        error = nested if isinstance(nested, BaseException) else (
            error.__cause__ or error.__context__)
        seen += 1
    return None


class HealthLog:
    """/health's verdict in the worker's log too: a WARNING once it has been unhealthy for
    ``grace`` seconds (a start's join is not news), with its reasons and what holds the
    fetch loop back, again every ``repeat`` seconds while it stays so, and an INFO once
    healthy again. A stall nobody scrapes is then on record."""

    def __init__(self, grace: float = 10.0, repeat: float = 60.0) -> None:
        self._grace, self._repeat = grace, repeat
        self._since: float | None = None  # when it turned unhealthy (None: healthy)
        self._told: float | None = None  # when it was last logged

    def observe(self, report: dict[str, Any], now: float) -> None:
        if report["healthy"]:
            if self._told is not None and self._since is not None:
                log.info("healthy again after %.0fs", now - self._since)
            self._since = self._told = None
            return
        if self._since is None:
            self._since = now
        if now - self._since < self._grace or (
                self._told is not None and now - self._told < self._repeat):
            return
        self._told = now
        fetch = (report.get("consumer") or {}).get("fetch")
        log.warning("unhealthy for %.0fs (/health answers 503): %s%s", now - self._since,
                    "; ".join(report["reasons"]), f"; fetch loop: {fetch}" if fetch else "")
