"""What every long-running process shares: node id, signals, logging, waiting for the store,
and, under supervisord, dying with it and waiting longer after each crash in a row.

Like the roles, a process's life knows PostgreSQL and Kafka only through a port
(`chronos.ports.ProcessServices`: the schema check, the Kafka probe); `chronos.processes` hands it the
real ones."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import orjson

from chronos import codec, config, logs
from chronos.config import Settings, redact_url
from chronos.errors import ConfigError, KafkaRefused, PoolModeMismatch, SchemaError, StoreRefused, StoreUnavailable
from chronos.ports import ProcessServices
from chronos.runtime import orphans
from chronos.runtime.backoff import Outage

log = logging.getLogger("chronos")

# Crash backoff under supervisord, which restarts a crashed program at once, every time: the
# first restart after a crash is immediate, each further crash in a row doubles the wait, and a
# run that lasted STABLE_RUN_S ends the series.
STABLE_RUN_S = 60.0
CRASH_WAIT_FIRST_S = 1.0
CRASH_WAIT_CAP_S = 60.0

# The cyclic garbage collector's youngest generation is collected every 700 allocations by default.
# A batch of 2,000 messages allocates tens of thousands of containers that live until the batch is
# written, so each collection traversed them again and again, a sizeable share of the consumer's and
# the firer's instructions per message (measured in docs/benchmarks/hot-path.md, "What changed"). Every
# 20,000 allocations, about once per batch, and the older generations as often as before relative to it.
GC_THRESHOLD = (20_000, 10, 10)


def tune_gc() -> None:
    """Tune the cyclic garbage collector for batches (`GC_THRESHOLD`)."""
    gc.set_threshold(*GC_THRESHOLD)


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


def wait_for_schema(settings: Settings, life: Lifecycle, services: ProcessServices) -> Settings | None:
    """Block until PostgreSQL answers with the right schema (retrying with backoff while it is down),
    then settle CHRONOS_DATABASE_POOL_MODE=auto by probing for a pooler in transaction mode: the settings
    with the pool mode the process talks in, or None if stopped meanwhile.

    An unmigrated database raises SchemaError, a refused password or certificate StoreRefused, a pooler in
    statement mode ConfigError: waiting would not fix them.
    """
    outage = Outage(log, first=0.5, cap=10.0)
    settings.databases()  # a configuration error now, when there is no database at all
    while life.running:
        try:
            mode = services.check_store()
            outage.ok()
        except StoreRefused:
            raise
        except StoreUnavailable as exc:
            life.sleep(outage.failed(exc))
            continue
        return config.replace(settings, database_pool_mode=mode)
    return None


def crash_wait(previous: dict | None, now: float) -> tuple[int, float]:
    """(crashes in a row, seconds to wait before working) for a program starting at `now`.

    `previous` is what the last start recorded: {"started": epoch s, "crashes": n, "clean": bool}.
    A run that did not record a clean end crashed (an unhandled error, a signal, a SIGKILL after
    supervisord's stopwaitsecs).
    """
    if not previous or previous.get("clean", True):
        return 0, 0.0
    crashes = 1
    if now - float(previous.get("started", 0.0)) < STABLE_RUN_S:
        crashes += int(previous.get("crashes", 0))
    if crashes == 1:
        return 1, 0.0
    return crashes, min(CRASH_WAIT_CAP_S, CRASH_WAIT_FIRST_S * 2 ** (crashes - 2))


class RunRecord:
    """What a program under supervisord remembers of its last start, in CHRONOS_RUN_DIR."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def under_supervisord(cls) -> "RunRecord | None":
        name, run_dir = os.environ.get("SUPERVISOR_PROCESS_NAME"), os.environ.get("CHRONOS_RUN_DIR")
        if not name or not run_dir or not os.environ.get("SUPERVISOR_ENABLED"):
            return None
        return cls(Path(run_dir) / f"{name}.run.json")

    def read(self) -> dict | None:
        try:
            return orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("cannot read %s (%s): counting no crash", self.path, exc)
            return None

    def write(self, record: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_bytes(orjson.dumps(record))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot write %s (%s): crashes in a row will not be counted", self.path, exc)


def _begin(record: RunRecord) -> tuple[dict, float]:
    """Record this start: (the record, seconds to wait first for the crashes in a row before it).

    Its start is when the work begins, after the wait, so a run that crashes right after a long
    wait still counts as short; it is written before waiting, so a crash meanwhile counts too.
    """
    now = time.time()
    crashes, wait = crash_wait(record.read(), now)
    current = {"started": now + wait, "crashes": crashes, "clean": False}
    record.write(current)
    return current, wait


def run_process(role: str, settings: Settings, body: Callable[[Settings, uuid.UUID, Lifecycle], None], *,
                services: ProcessServices, kafka: bool = True) -> int:
    """Run a role's `body` as this process's work, from start (logging, signals, crash waits, the schema
    and, if it uses `kafka`, Kafka's acceptance of its TLS and SASL settings, asked of `services`) to a
    clean end: the exit code."""
    settings.require_services()
    node_id = uuid.uuid4()
    logs.setup(role, str(node_id), settings.log_level, settings.log_format, settings.secrets())
    life = Lifecycle()
    life.install_signals()
    record = RunRecord.under_supervisord()
    # a program never outlives its supervisord: orphaned, nobody could stop or restart it
    if record is not None and not orphans.parent_alive_after_asking(signal.SIGTERM):
        log.warning("%s: supervisord is gone; not starting", role)
        return 0
    current, wait = _begin(record) if record is not None else (None, 0.0)
    database = redact_url(settings.database_url or "") if settings.cell is None or not settings.database_url else \
        f"{redact_url(settings.database_url)} (cell {settings.cell})"
    if settings.cells and settings.cell is None:
        database = "cells " + ", ".join(f"{name} {redact_url(url)}" for name, url in settings.cells)
    log.info("%s starting: node %s, pid %d, database %s, kafka %s, header codec %s, %s",
             role, node_id, os.getpid(), database, settings.kafka_bootstrap_servers, codec.IMPL, services.clients())
    if current is not None and current["crashes"]:
        log.warning("the previous run ended in a crash (%d in a row)%s", current["crashes"],
                    f": waiting {wait:.0f}s before starting" if wait else "")
    tune_gc()
    code = _run(role, settings, node_id, life, body, services, kafka) if life.sleep(wait) else 0
    if record is not None and current is not None:
        record.write({**current, "clean": True})
    return code


# How long a process waits at start for Kafka to answer before it goes on anyway: its clients then keep
# retrying (an outage), while a refusal of its TLS or SASL settings ends it at once.
KAFKA_CHECK_S = 5.0


def _run(role: str, settings: Settings, node_id: uuid.UUID, life: Lifecycle,
         body: Callable[[Settings, uuid.UUID, Lifecycle], None], services: ProcessServices, kafka: bool) -> int:
    try:
        settled = wait_for_schema(settings, life, services)
        if settled is None:
            return 0
        settings = settled
        if kafka:
            reason = services.probe_kafka(KAFKA_CHECK_S)
            if reason is not None:
                log.warning("kafka does not answer yet (%s); starting anyway, the clients keep retrying", reason)
    except (SchemaError, StoreRefused, KafkaRefused, PoolModeMismatch) as exc:
        log.error("%s", exc)
        return exc.exit_code
    started = time.monotonic()
    try:
        body(settings, node_id, life)
    except ConfigError as exc:  # found out once running (PoolModeMismatch): final, like any configuration error
        log.error("%s", exc)
        return exc.exit_code
    log.info("%s stopped after %.0fs", role, time.monotonic() - started)
    return 0
