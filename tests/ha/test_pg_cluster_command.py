"""`chronos pg-cluster` as an operator runs it: the ready line and file, nothing left running when it is
killed outright, the same URL and data when it starts again from its directory, a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from helpers import wait_for

from chronos.runtime import orphans

pytestmark = pytest.mark.slow


def _start(workdir: Path, ready: Path, out: Path) -> subprocess.Popen:
    with open(out, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "chronos", "pg-cluster", "--dir", str(workdir), "--fast",
                                 "--ready-file", str(ready)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    wait_for(lambda: ready.exists() or proc.poll() is not None, timeout=120, what="the ready file")
    assert proc.poll() is None, out.read_text()
    return proc


def test_pg_cluster_runs_stops_and_leaves_nothing_behind(tmp_path: Path):
    workdir, ready, out = tmp_path / "cluster", tmp_path / "ready.json", tmp_path / "out.log"
    proc = _start(workdir, ready, out)
    try:
        info = json.loads(ready.read_text())
        url = info["database_url"]
        assert [m["name"] for m in info["members"]] == ["pg0", "pg1"]
        assert all(m["patroni_pid"] and m["postmaster_pid"] for m in info["members"])
        password = url.split("@")[0].rsplit(":", 1)[1]
        ready_line = next(line for line in out.read_text().splitlines() if line.startswith("ready "))
        assert "chronos:***@" in ready_line and password not in ready_line
        assert oct(ready.stat().st_mode & 0o777) == "0o600"
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('across restarts')")

        # killed outright: every process it started dies with it
        proc.kill()
        proc.wait()
        wait_for(lambda: not orphans.leftovers(workdir.resolve()), timeout=30,
                 what="the cluster's processes to die with the killed command")

        # started again from its directory: the same URL, the same data
        ready.unlink()
        proc = _start(workdir, ready, out)
        assert json.loads(ready.read_text())["database_url"] == url
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [("across restarts",)]

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(90) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.read_text().splitlines()[-1] == "stopped"
    assert not ready.exists()
    assert not orphans.leftovers(workdir.resolve())
