"""Shared fixtures: a real Kafka-protocol broker and real chronos processes, started by the tests.

One embedded broker per test session; each test gets fresh topic names. The PostgreSQL fixtures
(`pg_server`, `database_url`, `empty_database_url`) are the repository's conftest.py, shared with
the micro benchmarks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import orjson
from helpers import EMBEDDED_KAFKA

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session: pytest.Session) -> None:
    """The native codec must really be loaded unless the run asked for the pure-Python one, and psycopg
    must run on its C implementation."""
    import chronos.codec as codec
    wanted = os.environ.get("CHRONOS_IMPL", "")
    if wanted != "python" and codec.IMPL != "native":
        raise pytest.UsageError(f"the native codec was expected but {codec.IMPL!r} is loaded: "
                                "build it with `pip install -e .`")
    # psycopg's C implementation (psycopg[c], built by the Makefile against the embedded wheel's libpq)
    import psycopg
    if psycopg.pq.__impl__ != "c":
        raise pytest.UsageError(f"psycopg's C implementation was expected but {psycopg.pq.__impl__!r} is loaded: "
                                "set up the environment with `make test` (it builds psycopg[c])")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a clean copy of the checkout, once for the tests of the distribution and the
    fleet's hosts: the one `make test` built before the tests started, or else once for the whole run, when
    pytest-xdist's workers run them (the first to ask builds it in the run's directory, under a lock the
    other waits on)."""
    import fcntl
    from kits.fleet import build_wheel
    from kits.fleet.install import built_ahead
    ahead = built_ahead("checkout")
    if ahead is not None:
        return ahead
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    with open(shared / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes (a worker killed meanwhile included)
        built = sorted(shared.glob("wheel-*/dist/*.whl"))  # a failed build's directory holds none
        return built[0] if built else build_wheel(Path(tempfile.mkdtemp(prefix="wheel-", dir=shared)))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory):
    from chronos.embedded.broker import EmbeddedBroker
    base = tmp_path_factory.mktemp("broker")
    b = EmbeddedBroker(log_path=base / "broker.log")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def topics(broker) -> dict[str, str]:
    """Fresh input, output and dead-letter topics (4 partitions each)."""
    from chronos.adapters.kafka.admin import create_topics
    suffix = uuid.uuid4().hex[:8]
    names = {"input": f"in-{suffix}", "output": f"out-{suffix}", "dlq": f"dlq-{suffix}"}
    create_topics(broker.bootstrap_servers, {n: 4 for n in names.values()})
    return names


@pytest.fixture
def chronos_env(database_url, broker, topics) -> dict[str, str]:
    """Environment for chronos processes against this test's database and topics."""
    props = ",".join(f"{k}={v}" for k, v in EMBEDDED_KAFKA.items())
    return {
        "CHRONOS_DATABASE_URL": database_url,
        "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "CHRONOS_INPUT_TOPIC": topics["input"],
        "CHRONOS_OUTPUT_TOPIC": topics["output"],
        "CHRONOS_DLQ_TOPIC": topics["dlq"],
        "CHRONOS_CONSUMER_GROUP": f"chronos-{uuid.uuid4().hex[:8]}",
        "CHRONOS_KAFKA_PROPERTIES": props,
        "CHRONOS_HOLD_TIME_MS": "3000",
        "CHRONOS_FAILURE_DETECTION_INTERVAL_MS": "300",
        "CHRONOS_LOG_LEVEL": "info",
    }


class Processes:
    """Chronos processes started as real OS processes; every one is killed at teardown."""

    def __init__(self, base_env: dict[str, str], log_dir: Path):
        self.base_env = base_env
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, role: str, **extra_env: str) -> subprocess.Popen:
        env = {**os.environ, **self.base_env, **extra_env}
        log_path = self.log_dir / f"{role}-{len(self.procs)}.log"
        proc = subprocess.Popen([sys.executable, "-m", "chronos", role], env=env,
                                stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
        self.procs.append((role, proc, log_path))
        return proc

    def log_of(self, proc: subprocess.Popen) -> str:
        for _, p, path in self.procs:
            if p is proc:
                return path.read_text(errors="replace")
        raise KeyError(proc)

    def wait_for_log(self, proc: subprocess.Popen, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            content = self.log_of(proc)
            if text in content:
                return content
            if proc.poll() is not None:
                raise AssertionError(f"process exited ({proc.returncode}) before logging {text!r}:\n{content}")
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not logged within {timeout}s:\n{self.log_of(proc)}")

    def stop_all(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for _, proc, _ in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(chronos_env, tmp_path) -> Iterator[Processes]:
    procs = Processes(chronos_env, tmp_path)
    yield procs
    procs.stop_all()


# -- fault scenarios (tests/faults, tests/ha): one summary row per scenario, the table at the end, as JSON --

_FAULT_ROWS: list[dict] = []
_FAULT_REPORT: list[Path] = []


@pytest.fixture(scope="session")
def fault_report(tmp_path_factory: pytest.TempPathFactory):
    """Call with a kits.verdicts.Report: prints its table line and rewrites the session's JSON report."""
    path = tmp_path_factory.getbasetemp() / "faults-report.json"

    def record(report) -> None:
        _FAULT_ROWS.append(report.row())
        path.write_bytes(orjson.dumps(_FAULT_ROWS, option=orjson.OPT_INDENT_2))
        if not _FAULT_REPORT:
            _FAULT_REPORT.append(path)
        print(f"\n{report.line()}\nfault report: {path}")
    return record


def pytest_terminal_summary(terminalreporter, config) -> None:
    rows, paths = list(_FAULT_ROWS), list(_FAULT_REPORT)
    if not rows and not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist"):
        # the workers' reports (pytest-xdist): each wrote its own under the session's base directory
        for path in sorted(config._tmp_path_factory.getbasetemp().glob("*/faults-report.json")):
            rows += orjson.loads(path.read_bytes())
            paths.append(path)
    if not rows:
        return
    tr = terminalreporter
    tr.section("fault scenarios")
    tr.write_line(f"{'scenario':<28} {'sent':>6} {'delivered':>9} {'lost':>4} {'early':>5} {'dups':>5} "
                  f"{'unexpl.':>7} {'recovery':>9} {'max late':>9} {'reread':>6}")
    for r in rows:
        tr.write_line(f"{r['scenario']:<28} {r['sent']:>6} {r['delivered']:>9} {r['lost']:>4} {r['early']:>5} "
                      f"{r['duplicates']:>5} {r['unexplained_duplicates']:>7} {r['recovery_s']:>8.1f}s "
                      f"{r['max_lateness_s']:>8.1f}s {r['lost_found_on_reread']:>6}")
    tr.write_line("reread: delivered, but only seen when the output topic was read again from the start")
    tr.write_line("JSON: " + ", ".join(map(str, paths)))


# -- two workers (make test): the tests of servers of their own (a fleet of hosts, a replicated PostgreSQL), the
# fault scenarios under load and the containers in one, everything else in the other; each group runs in order in
# its worker, the two groups side by side, about as long as each other --

SERVER_GROUPS = ("fleet", "ha", "faults", "containers")
# Stacks of several cells under load, the tests on Debian's PostgreSQL 15 server of their own, the broker killed
# and started again, and the day's benchmark on a stack of its own, in the servers' group too: the two groups then
# take about as long (without the cells the other group ended five minutes after the servers' on two cores; without
# PostgreSQL 15, two and a half; without the broker's restarts, 80 s once the fault scenarios waited for events
# instead of fixed times; without the day's benchmark, two minutes once the wheels were built before the tests)
SERVER_FILES = ("e2e/test_up_cells.py", "e2e/test_cell_moves.py", "e2e/test_add_cell.py", "production/test_postgres_15.py",
                "e2e/test_broker_restart.py", "e2e/test_day.py")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: nothing without it (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduling by scope, with two scopes: the servers' and the faults' tests, and the others."""
    from xdist.scheduler import LoadScopeScheduling

    class TwoGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/")
            servers = len(parts) > 2 and (parts[1] in SERVER_GROUPS or "/".join(parts[1:3]).split("::")[0] in SERVER_FILES)
            return "servers" if servers else "main"
    return TwoGroups(config, log)
