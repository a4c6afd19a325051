"""Run the console on uvicorn (on uvloop), in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid

import uvicorn

from chronos import logs
from chronos.config import Settings, redact_url
from chronos.console.app import create_app
from chronos.console.launch import listen_socket
from chronos.adapters.postgres.store import Store

log = logging.getLogger("chronos.console")


def serve(settings: Settings, *, fd: int | None = None) -> int:
    """Serve until stopped; `fd` is an already listening socket handed over by `chronos up`."""
    node = uuid.uuid4()
    logs.setup("console", str(node), settings.log_level, settings.log_format, settings.secrets())
    sock = socket.socket(fileno=fd) if fd is not None else listen_socket(settings.console_host, settings.console_port)
    host, port = sock.getsockname()[:2]
    stores = {cell: Store(url, pool_mode=settings.database_pool_mode, application_name="chronos console")
              for cell, url in settings.databases().items()}
    app = create_app(settings, stores, metrics_urls=settings.console_metrics_urls)
    databases = f"database {redact_url(settings.database_url or '')}" if not settings.cells else \
        "cells " + ", ".join(f"{cell} {redact_url(url)}" for cell, url in settings.cells)
    log.info("console serving on http://%s:%d (node %s, %s, %s, metrics from the processes PostgreSQL "
             "lists and %d URLs given)", host if ":" not in host else f"[{host}]", port, node, databases,
             "read-only: no CHRONOS_CONSOLE_TOKEN" if settings.console_token is None else "actions need the token",
             len(settings.console_metrics_urls))
    server = uvicorn.Server(uvicorn.Config(app, loop="uvloop", http="h11", lifespan="on", log_config=None,
                                          access_log=False, server_header=False, timeout_graceful_shutdown=5))
    asyncio.run(server.serve(sockets=[sock]))
    log.info("console stopped")
    return 0
