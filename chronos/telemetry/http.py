"""The small HTTP server of a process: /metrics (Prometheus text format), /healthz and /livez (200 or 503, JSON)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest


class _Handler(BaseHTTPRequestHandler):
    server: "MetricsServer"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
        elif path in ("/healthz", "/health", "/livez"):
            ok, report = (self.server.liveness_report if path == "/livez" else self.server.health_report)()
            self._send(200 if ok else 503, "application/json", orjson.dumps(report) + b"\n")
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz or /livez\n")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - scrapes are not events worth a line
        return


class MetricsServer(ThreadingHTTPServer):
    """Serves a registry's metrics, a health report and a liveness report (each `(ok, report)`) on `address`;
    binds at once (OSError if it cannot), answers from a thread of its own once started."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry,
                 health_report: Callable[[], tuple[bool, dict[str, Any]]],
                 liveness_report: Callable[[], tuple[bool, dict[str, Any]]]):
        self.registry = registry
        self.health_report, self.liveness_report = health_report, liveness_report
        super().__init__(address, _Handler)

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="chronos-metrics", daemon=True).start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.shutdown()
        self.server_close()
