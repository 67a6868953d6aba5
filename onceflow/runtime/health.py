"""HTTP endpoint of a running worker: ``/metrics`` (Prometheus) and ``/health`` (JSON).

``/health`` answers 200 while the supervisor runs the pipeline and progress
is being made, 503 when the supervisor has escalated, the pipeline is not
running (restarting or stopped), its consumer's group join has taken longer
than ``join_timeout``, or records wait (lag > 0) while nothing was processed
or committed for ``stall_timeout`` seconds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from onceflow.actors import metrics

Status = Callable[[], dict[str, Any]]


class HealthServer:
    """Serves ``/metrics`` and ``/health`` on a daemon thread."""

    def __init__(self, host: str, port: int, status: Status):
        handler = _handler(status)
        self._server = ThreadingHTTPServer((host, port), handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="onceflow-http",
                                        daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(status: Status) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics.REGISTRY))
            elif self.path == "/health":
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
                  escalated: str | None, stall_timeout: float) -> dict[str, Any]:
    """What /health reports: per-child state, escalation, progress, lag and held commits."""
    idle = metrics.seconds_since_progress()
    lag = metrics.total_lag()
    stalled = lag > 0 and idle > stall_timeout
    # Records the broker does not take (e.g. an unreachable dead-letter topic) wait in
    # the outbox, and commits with them: processing goes on, so say it here.
    outbox, since_commit = metrics.outbox_records(), metrics.seconds_since_commit()
    held = outbox > 0 and since_commit > stall_timeout
    return {
        "healthy": escalated is None and bool(children)
        and all(state == "running" for state in children.values()) and not stalled
        and not held and not (consumer and consumer["join_overdue"]),
        "pipeline": pipeline_id,
        "children": children,
        "consumer": consumer,
        "escalated": escalated,
        "seconds_since_progress": round(idle, 3),
        "lag": lag,
        "stalled": stalled,
        "outbox": outbox,
        "seconds_since_commit": round(since_commit, 3),
        "commits_held": held,
    }
