"""Scenario 4: restart PostgreSQL mid-load (stop it, wait, start it again on the same port); 4b: SIGKILL
the embedded PostgreSQL of `chronos up`, which starts it again."""

from __future__ import annotations

import os
import signal
import time

import orjson
import pytest

from chronos.embedded.postgres import EmbeddedPostgres
from chronos.embedded.procs import free_port
from faultchecks import check_common
from helpers import wait_for
from kits.tls import Authority, require_pg15
from kits.faults import Scenario

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PROGRAMS = ("consumer_00", "firer_00", "firer_01", "detector_00")


@pytest.fixture(params=["embedded", "15 over TLS"])
def postgres(request, tmp_path):
    """A PostgreSQL this test owns, so it can stop and start it under a running stack, and its URL: the
    embedded one, or Debian's PostgreSQL 15 reached over TLS that checks its certificate (the processes
    reconnect through the TLS handshake after the restart)."""
    if request.param == "embedded":
        pg = EmbeddedPostgres(tmp_path / "pg", port=free_port(), fast=True, log_path=tmp_path / "pg.log")
        url = pg.url
    else:
        authority = Authority("fault", tmp_path / "ca")
        pg = EmbeddedPostgres(tmp_path / "pg", port=free_port(), fast=True, log_path=tmp_path / "pg.log",
                              bin_dir=require_pg15(), tls=authority.issue("postgres"))
        url = f"{pg.url}?sslmode=verify-full&sslrootcert={authority.ca_file}"
    pg.start()
    yield pg, url
    pg.stop()


def test_postgres_restarted_mid_load(tmp_path, postgres, fault_report, request):
    postgres, url = postgres
    name = "4 PostgreSQL restart 5 s" + (" TLS" if "TLS" in request.node.callspec.id else "")
    with Scenario(name, tmp_path / "stack", "--firers", "2", "--database-url", url) as sc:
        time.sleep(5)  # past the longest delay of the load: rows waiting and in flight when it stops
        down = time.time()
        postgres.stop()
        time.sleep(5)
        postgres.start()
        sc.fault("PostgreSQL stopped 5 s", down, end=time.time())
        # load on after the restart, until every process is back at work on it
        wait_for(lambda: all("postgres reachable again after" in sc.stack.log(name) for name in PROGRAMS), 60,
                 "every process reaching PostgreSQL again")
        report = sc.finish(window_explains=True)
        fault_report(report)
        check_common(sc, report)
        for name in PROGRAMS:  # every process noticed the outage and the recovery, and kept running
            log = sc.stack.log(name)
            assert "postgres unavailable" in log, (name, log[-3000:])
            assert "postgres reachable again after" in log, (name, log[-3000:])
            assert log.count("starting: node") == 1, (name, log[-3000:])


def test_embedded_postgres_sigkilled_under_load(tmp_path, fault_report):
    """`chronos up` starts its PostgreSQL again after a SIGKILL: same port, same broker, nothing lost."""
    with Scenario("4b embedded PostgreSQL SIGKILL", tmp_path, rate=200) as sc:
        killed, broker = sc.info["postgres_pid"], sc.info["broker_pid"]
        time.sleep(5)
        down = time.time()
        os.kill(killed, signal.SIGKILL)
        end = time.monotonic() + 90
        while "the embedded PostgreSQL runs again" not in sc.stack.output() and time.monotonic() < end:
            assert sc.stack.proc.poll() is None, f"chronos up exited:\n{sc.stack.output()}"
            time.sleep(0.1)
        sc.fault("embedded PostgreSQL SIGKILL", down, end=time.time())
        time.sleep(5)
        report = sc.finish(window_explains=True)
        fault_report(report)
        check_common(sc, report)
        out = sc.stack.output()
        assert f"the embedded PostgreSQL (pid {killed}) stopped unexpectedly (killed by SIGKILL)" in out, out
        assert "the embedded PostgreSQL runs again" in out, out
        info = orjson.loads(sc.stack.ready_file.read_bytes())
        assert info["postgres_pid"] != killed and info["broker_pid"] == broker
        assert info["database_url"] == sc.info["database_url"]
        for name in ("consumer_00", "firer_00", "detector_00"):
            log = sc.stack.log(name)
            assert log.count("starting: node") == 1, (name, log[-3000:])
