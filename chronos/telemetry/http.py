"""The small HTTP server of a process: /metrics (Prometheus text format), /healthz and /livez (200 or 503, JSON),
over HTTPS and behind basic authentication when a web configuration file says so (chronos.telemetry.webconfig);
/healthz and /livez never ask for a password, so that a supervisor's or an orchestrator's probe needs none."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from chronos.telemetry.webconfig import BasicAuth, WebConfig

log = logging.getLogger("chronos.metrics")

HEALTH_PATHS = ("/healthz", "/health")
LIVENESS_PATH = "/livez"
# how long a connection may take to say what it wants (and to shake hands): a client that stalls holds
# one thread of the server for that long, no longer
REQUEST_TIMEOUT_S = 10.0


class _Handler(BaseHTTPRequestHandler):
    server: "MetricsServer"
    timeout = REQUEST_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in the connection's own thread, not in the one that accepts

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path in HEALTH_PATHS or path == LIVENESS_PATH:
            ok, report = (self.server.liveness_report if path == LIVENESS_PATH else self.server.health_report)()
            self._send(200 if ok else 503, "application/json", orjson.dumps(report) + b"\n")
        elif self.server.auth is not None and not self.server.auth.allows(self.headers.get("Authorization")):
            self._send(401, "text/plain; charset=utf-8", b"unauthorized\n",
                       {"WWW-Authenticate": 'Basic realm="chronos", charset="UTF-8"'})
        elif path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz or /livez\n")

    def _send(self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - scrapes are not events worth a line
        return


class CellLabelled:
    """What a process serving one cell exposes: its registry's metrics, every sample labelled with the cell
    (`generate_latest` reads only `collect`)."""

    def __init__(self, registry: CollectorRegistry, cell: str):
        self.registry, self.cell = registry, cell

    def collect(self) -> Iterable[Any]:
        for family in self.registry.collect():
            family.samples = [sample._replace(labels={**sample.labels, "cell": self.cell}) for sample in family.samples]
            yield family


class MetricsServer(ThreadingHTTPServer):
    """Serves a registry's metrics, a health report and a liveness report (each `(ok, report)`) on `address`
    (host, port), over TLS and with basic authentication as `web` says; binds at once (OSError if it cannot),
    answers from a thread of its own once started."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry | CellLabelled,
                 health_report: Callable[[], tuple[bool, dict[str, Any]]],
                 liveness_report: Callable[[], tuple[bool, dict[str, Any]]], web: WebConfig | None = None):
        self.registry = registry
        self.health_report, self.liveness_report = health_report, liveness_report
        web = web or WebConfig()
        self.context = web.server_context()
        self.auth = BasicAuth(web.users) if web.users else None
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    @property
    def scheme(self) -> str:
        return "https" if self.context is not None else "http"

    def get_request(self) -> tuple[Any, Any]:
        conn, addr = super().get_request()
        if self.context is not None:
            # the handshake waits for the client: done by the connection's thread (`_Handler.setup`)
            conn = self.context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hangs up, stalls past the timeout or fails the handshake: its problem, not the process's
        log.debug("metrics request from %s failed", client_address, exc_info=True)

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="chronos-metrics", daemon=True).start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.shutdown()
        self.server_close()
