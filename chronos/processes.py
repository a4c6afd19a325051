"""The three processes with their real adapters: each role built on a PostgreSQL store and
confluent-kafka clients, and run (`chronos consumer|firer|detector`, through `chronos.cli`).

The roles know the outside world only through the ports (`chronos.ports`); this is where the
adapters behind them are made.
"""

from __future__ import annotations

import uuid

from chronos.adapters.kafka.clients import make_consumer, make_producer
from chronos.adapters.postgres.store import role_store
from chronos.config import Settings
from chronos.telemetry.metrics import ConsumerTelemetry, DetectorTelemetry, FirerTelemetry
from chronos.roles.consumer import ConsumerProcess
from chronos.roles.detector import DetectorProcess
from chronos.roles.firer import FirerProcess
from chronos.runtime.process import Lifecycle


def build_consumer(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> ConsumerProcess:
    """The consumer with its real adapters: a PostgreSQL store and confluent-kafka clients."""
    return ConsumerProcess(settings, life,
                           store=role_store(settings, node_id, "consumer"),
                           producers=lambda: make_producer(settings, "consumer producer"),
                           consumers=lambda on_commit: make_consumer(settings, "consumer", on_commit=on_commit),
                           watchers=lambda: make_consumer(settings, "consumer's group watcher")[0],
                           telemetry=ConsumerTelemetry(node_id, settings))


def build_firer(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> FirerProcess:
    """The firer with its real adapters: PostgreSQL stores and a confluent-kafka producer."""
    settings.require_database()  # a configuration error at start, not in the claimer's or the settler's first statement
    # a lost claim, delete or hand-back only fires a row again: no need to wait for the WAL flush
    return FirerProcess(settings, life,
                        stores=lambda: role_store(settings, node_id, "firer", synchronous_commit=False),
                        producers=lambda: make_producer(settings, "firer"),
                        telemetry=FirerTelemetry(node_id, settings))


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
