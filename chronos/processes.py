"""The three processes with their real adapters: each role built on a PostgreSQL store and
confluent-kafka clients, and run (`chronos consumer|firer|detector`, through `chronos.cli`).

The roles, and a process's life, know the outside world only through the ports (`chronos.ports`); this
is where the adapters behind them are made.
"""

from __future__ import annotations

import functools
import logging
import uuid

import psycopg

from chronos.adapters.kafka.admin import probe
from chronos.adapters.kafka.clients import make_consumer, make_producer
from chronos.adapters.postgres import pooling
from chronos.adapters.postgres.connection import connect
from chronos.adapters.postgres.migrations import check_schema
from chronos.adapters.postgres.store import role_store, take_session
from chronos.config import Settings
from chronos.telemetry.metrics import ConsumerTelemetry, DetectorTelemetry, FirerTelemetry
from chronos.roles.consumer import ConsumerProcess
from chronos.roles.detector import DetectorProcess
from chronos.roles.firer import FirerProcess
from chronos.runtime.process import Lifecycle, run_process

log = logging.getLogger("chronos")


def build_consumer(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> ConsumerProcess:
    """The consumer with its real adapters: a PostgreSQL store (one per cell, with cells) and confluent-kafka
    clients."""
    cells = {cell: role_store(settings, node_id, "consumer", url=url) for cell, url in settings.cells}
    return ConsumerProcess(settings, life,
                           store=next(iter(cells.values())) if cells else role_store(settings, node_id, "consumer"),
                           producers=lambda: make_producer(settings, "consumer producer"),
                           consumers=lambda on_commit: make_consumer(settings, "consumer", on_commit=on_commit),
                           watchers=lambda: make_consumer(settings, "consumer's group watcher")[0],
                           telemetry=ConsumerTelemetry(node_id, settings), cells=cells or None)


def build_firer(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> FirerProcess:
    """The firer with its real adapters: PostgreSQL stores and a confluent-kafka producer."""
    settings.require_database()  # a configuration error at start, not in the claimer's or the settler's first statement
    # a lost claim, delete or hand-back only fires a row again: no need to wait for the WAL flush
    return FirerProcess(settings, life,
                        stores=lambda: role_store(settings, node_id, "firer", synchronous_commit=False),
                        producers=lambda: make_producer(settings, "firer"),
                        telemetry=FirerTelemetry(node_id, settings),
                        takes=lambda: take_session(settings, node_id))


def build_detector(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> DetectorProcess:
    """The detector with its real adapter, a PostgreSQL store."""
    store = role_store(settings, node_id, "detector")
    return DetectorProcess(settings, life, store=store, telemetry=DetectorTelemetry(node_id, settings),
                           action_totals=store.action_totals)


def run(role: str, settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> None:
    """Build the process of `role` (consumer, firer or detector) with its real adapters and run it."""
    process: ConsumerProcess | FirerProcess | DetectorProcess
    if role == "consumer":
        process = build_consumer(settings, node_id, life)
    elif role == "firer":
        process = build_firer(settings, node_id, life)
    else:
        process = build_detector(settings, node_id, life)
    process.run()


class Services:
    """What a process's life asks of PostgreSQL and Kafka at its start (`chronos.ports.ProcessServices`), on
    psycopg and confluent-kafka, with the process's settings."""

    def __init__(self, settings: Settings, role: str):
        self.settings, self.role = settings, role

    def clients(self) -> str:
        return f"psycopg {psycopg.pq.__impl__} (libpq {psycopg.pq.version()})"

    def check_store(self) -> str:
        # a consumer with cells writes to every cell: each must be migrated
        urls = list(self.settings.databases().values()) if self.role == "consumer" else [self.settings.require_database()]
        for url in urls:
            with connect(url) as conn:
                check_schema(conn)
        mode = pooling.resolve_pool_mode(urls[0], self.settings.database_pool_mode)
        if mode == pooling.TRANSACTION:
            log.info("PostgreSQL is reached through a pooler in transaction mode (%s=%s): no prepared statements, "
                     "settings and the staging table in each transaction", pooling.SETTING,
                     self.settings.database_pool_mode)
        return mode

    def probe_kafka(self, timeout: float) -> str | None:
        assert self.settings.kafka_bootstrap_servers is not None  # require_services()
        return probe(self.settings.kafka_bootstrap_servers, self.settings.kafka_config, timeout,
                     self.settings.secrets(), what=self.role)


def main(role: str, settings: Settings) -> int:
    """`chronos consumer|firer|detector`: the process's life (chronos.runtime.process) around its role, on the
    real adapters; the exit code."""
    return run_process(role, settings, functools.partial(run, role), services=Services(settings, role),
                       kafka=role != "detector")
