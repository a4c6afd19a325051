"""Where a process serves /metrics, on a store whose schema predates chronos_processes (version 9: this
release's hosts are upgraded before `chronos migrate` runs): the process says nothing there and goes on,
the console and `chronos status` find no process there, and both work once the store is migrated."""

from __future__ import annotations

import logging
import types
import uuid

import pytest

from chronos.adapters.postgres import migrations
from chronos.adapters.postgres.store import Store
from chronos.config import Settings
from chronos.errors import StoreRejected
from chronos.telemetry.metrics import DetectorTelemetry


def test_before_version_10_nothing_is_said_nor_listed_and_after_it_both_work(empty_database_url, caplog):
    url = empty_database_url
    assert migrations.migrate(url, [m for m in migrations.migrations() if m.version <= 9])[-1] == 9
    store, ops = Store(url, node_id=uuid.uuid4()), Store(url)
    try:
        with pytest.raises(StoreRejected):
            store.announce("detector", "http", 9600, "10.0.0.11")
        assert ops.announced(90_000) == []
        telemetry = DetectorTelemetry(store.node_id, Settings(metrics_port=9600))
        telemetry.server = types.SimpleNamespace(scheme="http")  # as if serving: what `announce` reads of it
        with caplog.at_level(logging.INFO, "chronos.metrics"):
            telemetry.announce(store, 0.0)
            telemetry.announce(store, 100.0)
        assert sum("once the schema is at version 10" in r.message for r in caplog.records) == 1  # said once
        assert migrations.migrate(url, [m for m in migrations.migrations() if m.version <= 10]) == [10]
        telemetry.announce(store, 200.0)
        assert [a.role for a in ops.announced(90_000)] == ["detector"]
        assert telemetry.announced == "http://127.0.0.1:9600/metrics"
    finally:
        store.close()
        ops.close()
