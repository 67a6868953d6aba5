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
