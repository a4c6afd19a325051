"""Scenario 4: restart PostgreSQL mid-load (stop it, wait, start it again on the same port)."""

from __future__ import annotations

import time

import pytest

from chronos.embedded import EmbeddedPostgres, free_port
from faultchecks import check_common
from faultload import Scenario

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PROGRAMS = ("consumer_00", "firer_00", "firer_01", "detector_00")


@pytest.fixture
def postgres(tmp_path):
    """A PostgreSQL this test owns, so it can stop and start it under a running stack."""
    pg = EmbeddedPostgres(tmp_path / "pg", port=free_port(), fast=True, log_path=tmp_path / "pg.log")
    pg.start()
    yield pg
    pg.stop()


def test_postgres_restarted_mid_load(tmp_path, postgres, fault_report):
    with Scenario("4 PostgreSQL restart 5 s", tmp_path / "stack", "--firers", "2",
                  "--database-url", postgres.url) as sc:
        time.sleep(8)
        down = time.time()
        postgres.stop()
        time.sleep(5)
        postgres.start()
        sc.fault("PostgreSQL stopped 5 s", down, end=time.time())
        time.sleep(10)
        report = sc.finish(window_explains=True)
        fault_report(report)
        check_common(sc, report)
        for name in PROGRAMS:  # every process noticed the outage and the recovery, and kept running
            log = sc.stack.log(name)
            assert "postgres unavailable" in log, (name, log[-3000:])
            assert "postgres reachable again after" in log, (name, log[-3000:])
            assert log.count("starting: node") == 1, (name, log[-3000:])
