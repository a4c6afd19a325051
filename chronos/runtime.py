"""What every long-running process shares: node id, signals, logging, waiting for the store."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from typing import Callable

import psycopg

from chronos import codec, logs
from chronos.config import Settings, redact_url
from chronos.errors import SchemaError, StoreUnavailable
from chronos.store import Backoff, check_schema, connect

log = logging.getLogger("chronos")


class Lifecycle:
    """The first SIGTERM/SIGINT asks for a graceful stop; the second makes it hard."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.hard_stop = False

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def stop(self, hard: bool = False) -> None:
        if self._stop.is_set():
            self.hard_stop = True
        self.hard_stop = self.hard_stop or hard
        self._stop.set()

    def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; returns whether the process is still running."""
        return not self._stop.wait(seconds)

    def install_signals(self) -> None:
        def handler(signum, _frame):
            log.info("received %s: %s", signal.Signals(signum).name,
                     "stopping now" if self._stop.is_set() else "finishing the current batch and stopping")
            self.stop()
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def wait_for_schema(settings: Settings, life: Lifecycle) -> bool:
    """Block until PostgreSQL answers with the right schema (retrying with backoff while it is down).

    An unmigrated database raises SchemaError: waiting would not fix it.
    """
    backoff = Backoff(first=0.5, cap=10.0)
    while life.running:
        try:
            with connect(settings.database_url) as conn:
                check_schema(conn)
            lasted = backoff.succeeded()
            if lasted is not None:
                log.warning("postgres reachable after %.1fs", lasted)
            return True
        except StoreUnavailable as exc:
            delay = backoff.failed()
            log.warning("postgres unavailable (%s); retrying in %.1fs", exc, delay)
            life.sleep(delay)
    return False


def run_process(role: str, settings: Settings, body: Callable[[Settings, uuid.UUID, Lifecycle], None]) -> int:
    settings.require_services()
    node_id = uuid.uuid4()
    logs.setup(role, str(node_id), settings.log_level, settings.log_format, settings.secrets())
    life = Lifecycle()
    life.install_signals()
    log.info("%s starting: node %s, pid %d, database %s, kafka %s, header codec %s, psycopg %s (libpq %s)",
             role, node_id, os.getpid(), redact_url(settings.database_url or ""), settings.kafka_bootstrap_servers,
             codec.IMPL, psycopg.pq.__impl__, psycopg.pq.version())
    try:
        if not wait_for_schema(settings, life):
            return 0
    except SchemaError as exc:
        log.error("%s", exc)
        return exc.exit_code
    started = time.monotonic()
    body(settings, node_id, life)
    log.info("%s stopped after %.0fs", role, time.monotonic() - started)
    return 0
