"""Bad input from operators: every configuration error and unreachable service is one line and a
distinct exit code; supervisord does not restart a program that cannot start, and restarts a crashing one
with growing waits; secrets never show."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from chronos.errors import EXIT_CONFIG, EXIT_SCHEMA, EXIT_UNAVAILABLE, StoreUnavailable
from chronos.up.datadir import short_run_dir
from chronos.up.supervisor import Supervisor, SupervisorError, supervisord_conf
from chronos.adapters.postgres.connection import connect

CHRONOS = [sys.executable, "-m", "chronos"]
DB_SECRET = "Db-S3cret-pw"
KAFKA_SECRET = "Kafka-S3cret-pw"


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("CHRONOS_", "PG"))}, **extra}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_line(stderr: str, command: str) -> str:
    """The command's error: its last stderr line, `chronos <command>: ...`, and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    assert lines[-1].startswith(f"chronos {command}: "), stderr
    return lines[-1]


CONFIG_ERRORS = [
    ("consumer", ["--hold-time-ms", "soon"], "CHRONOS_HOLD_TIME_MS must be a whole number"),
    ("firer", ["--hold-time-ms", "1000", "--lookahead-ms", "600"], "must be less than half of"),
    ("detector", [], "CHRONOS_DATABASE_URL is not set"),
    ("consumer", ["--ready-file", "/nonexistent/ready.json"], "does not exist"),
    ("firer", ["--kafka-properties-file", "/nonexistent/kafka.properties"], "cannot read"),
    ("detector", ["--log-format", "xml"], "must be one of text, json"),
    ("consumer", ["--input-topic", "no spaces allowed"], "not a valid Kafka topic name"),
    ("firer", ["--kafka-properties", "no-equals-sign"], "key=value"),
    ("migrate", [], "CHRONOS_DATABASE_URL is not set"),
    ("migrate", ["--database-url", f"mysql://app:{DB_SECRET}@db/x"], "must be a postgresql:// URL"),
    ("status", ["--database-url", f"host=db password='{DB_SECRET} \\' x'"], "must be a postgresql:// URL"),
    ("migrate", ["--database-url", f"host=db sslpassword={DB_SECRET}"], "must be a postgresql:// URL"),
    ("up", ["--consumers", "-1"], "--consumers must be between 0 and 64"),
    ("up", ["--allowed-topics", "("], "not a valid regular expression"),
    ("firer", ["--fire-rate-limits", "orders=fast"], "CHRONOS_FIRE_RATE_LIMITS: 'fast' is not a rate"),
    ("up", ["--fire-rate-default", "0"], "CHRONOS_FIRE_RATE_DEFAULT: a rate must be more than 0"),
    ("send", [], "no Kafka to send to"),
    ("send", ["--kafka-bootstrap-servers", "127.0.0.1:1", "--delay", "soon"], "not a duration"),
    ("send", ["--kafka-bootstrap-servers", "127.0.0.1:1", "--header", "no-value"], "--header must be key=value"),
    ("send", ["--kafka-bootstrap-servers", "127.0.0.1:1", "--kafka-properties", "no.such.property=1"],
     "Kafka settings are not valid"),
    ("tail", [], "no Kafka to read from"),
]


@pytest.mark.parametrize("command,args,message", CONFIG_ERRORS,
                         ids=[f"{c}-{m[:24]}" for c, _, m in CONFIG_ERRORS])
def test_configuration_errors_are_one_line_and_exit_2(tmp_path, command, args, message):
    out = subprocess.run(CHRONOS + [command, *args], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == EXIT_CONFIG, out.stderr
    line = _error_line(out.stderr, command)
    assert message in line
    assert DB_SECRET not in out.stderr + out.stdout


@pytest.mark.parametrize("role", ["consumer", "firer"])  # the detector has no Kafka client
def test_kafka_settings_librdkafka_refuses_are_a_configuration_error(role, chronos_env, tmp_path):
    env = _env(**{**chronos_env, "CHRONOS_KAFKA_PROPERTIES": "security.protocol=SSL,ssl.ca.location=/nonexistent/ca.pem,"
                  f"sasl.password={KAFKA_SECRET}"})
    out = subprocess.run(CHRONOS + [role], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_CONFIG, out.stderr
    assert "Kafka settings of the" in _error_line(out.stderr, role)
    assert KAFKA_SECRET not in out.stderr


def test_unreachable_services_are_one_line_and_exit_3(tmp_path, broker):
    """Each command that needs a service at start says which one it cannot reach (run side by side)."""
    port = _closed_port()
    url = f"postgresql://app:{DB_SECRET}@127.0.0.1:{port}/db"
    cases = {
        "migrate": ["migrate", "--database-url", url],
        # the password as a query parameter, and with an unescaped `/` (libpq then reads a host
        # `app` with the password's first part as its port, and says so)
        "migrate-query": ["migrate", "--database-url", f"postgresql://app@127.0.0.1:{port}/db?password={DB_SECRET}"],
        "status-query": ["status", "--database-url", f"postgresql://app@127.0.0.1:{port}/db?password={DB_SECRET}"],
        "status-slash": ["status", "--database-url", f"postgresql://app:{DB_SECRET}/x@127.0.0.1:{port}/db"],
        "send": ["send", "--kafka-bootstrap-servers", f"127.0.0.1:{port}", "--delay", "1s"],
        "tail": ["tail", "--kafka-bootstrap-servers", f"127.0.0.1:{port}"],
        "up-kafka": ["up", "--data-dir", str(tmp_path / "up"), "--bootstrap-servers", f"127.0.0.1:{port}",
                     "--kafka-properties", f"sasl.password={KAFKA_SECRET}"],
    }
    procs = {name: subprocess.Popen(CHRONOS + args, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, args in cases.items()}
    results = {name: (p.wait(90), *p.communicate()) for name, p in procs.items()}
    for name, (code, stdout, stderr) in results.items():
        assert code == EXIT_UNAVAILABLE, (name, stderr)
        command = cases[name][0]
        line = _error_line(stderr, command)
        assert "cannot reach Kafka" in line or "cannot connect to PostgreSQL" in line, line
        assert DB_SECRET not in stdout + stderr and KAFKA_SECRET not in stdout + stderr, name
    assert f"app:***@127.0.0.1:{port}" in results["migrate"][2]


def test_processes_wait_for_an_unreachable_database_and_log_it_without_the_password(tmp_path):
    """The services do not exit when PostgreSQL is down (supervisord may start them first): they
    wait with backoff, log it, and stop cleanly on SIGTERM."""
    port = _closed_port()
    urls = {"consumer": f"postgresql://app:{DB_SECRET}@127.0.0.1:{port}/db",
            "firer": f"postgresql://app@127.0.0.1:{port}/db?sslmode=disable&password={DB_SECRET}",
            "detector": f"postgresql://app:{DB_SECRET}/x@127.0.0.1:{port}/db"}
    shown = {"consumer": "app:***@", "firer": "password=***", "detector": "app:***@"}
    procs = {}
    for role, fmt in (("consumer", "text"), ("firer", "json"), ("detector", "text")):
        log = tmp_path / f"{role}.log"
        procs[role] = (subprocess.Popen(CHRONOS + [role], cwd=tmp_path, stdout=open(log, "wb"),
                                        stderr=subprocess.STDOUT,
                                        env=_env(CHRONOS_DATABASE_URL=urls[role], CHRONOS_LOG_FORMAT=fmt,
                                                 CHRONOS_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
                                                 CHRONOS_LOG_LEVEL="debug")), log)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and not all("postgres unavailable" in log.read_text() for _, log in procs.values()):
            time.sleep(0.2)
        time.sleep(1.5)
        for role, (proc, log) in procs.items():
            text = log.read_text()
            assert "postgres unavailable" in text and "retrying in" in text, (role, text)
            assert proc.poll() is None, (role, text)
            assert DB_SECRET not in text, role
            assert shown[role] in text, role
            proc.send_signal(signal.SIGTERM)
        for role, (proc, log) in procs.items():
            assert proc.wait(20) == 0, (role, log.read_text())
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize("role", ["consumer", "firer", "detector"])
def test_an_unmigrated_database_exits_4(role, processes, empty_database_url):
    proc = processes.start(role, CHRONOS_DATABASE_URL=empty_database_url)
    assert proc.wait(30) == EXIT_SCHEMA
    assert "run `chronos migrate` first" in processes.log_of(proc)


def test_kafka_secrets_never_reach_the_logs(tmp_path, processes, chronos_env):
    """SASL against a broker that does not speak it: librdkafka complains, the password never shows."""
    props = tmp_path / "kafka.properties"
    props.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=chronos\n"
                     f"sasl.password={KAFKA_SECRET}\ndebug=security,broker,conf\n")
    procs = [processes.start(role, CHRONOS_KAFKA_PROPERTIES_FILE=str(props), CHRONOS_LOG_LEVEL="debug",
                             CHRONOS_LOG_FORMAT=fmt)
             for role, fmt in (("consumer", "text"), ("firer", "json"))]
    end = time.monotonic() + 30
    while time.monotonic() < end and not all("sasl" in processes.log_of(p).lower() for p in procs):
        time.sleep(0.2)
    time.sleep(2)
    for proc in procs:
        text = processes.log_of(proc)
        assert "sasl" in text.lower(), text[-3000:]  # librdkafka did try SASL with these settings
        assert KAFKA_SECRET not in text


# -- supervisord: a program that cannot start ends; one that crashes is restarted with backoff ---


def _supervise(tmp_path: Path, **env: str) -> tuple[subprocess.Popen, Path]:
    log_dir = tmp_path / "logs"
    (tmp_path / "run").mkdir()
    log_dir.mkdir()
    run_dir = short_run_dir(tmp_path / "run")  # a Unix socket's path has a limit that tmp_path may pass
    full = _env(CHRONOS_BIN=f"{sys.executable} -m chronos", CHRONOS_RUN_DIR=str(run_dir),
                CHRONOS_LOG_DIR=str(log_dir), CHRONOS_CONSUMERS="1", CHRONOS_FIRERS="1", CHRONOS_DETECTORS="1",
                CHRONOS_CONSOLES="0", **env)
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-c", str(supervisord_conf()), "-n"],
                            env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, run_dir


def _programs(proc: subprocess.Popen, run_dir: Path) -> list[dict]:
    assert proc.poll() is None, "supervisord exited"
    try:
        return Supervisor(run_dir / "supervisor.sock").programs()
    except SupervisorError:  # not listening yet
        return []


def _wait_programs(proc: subprocess.Popen, run_dir: Path, done, what: str, timeout: float = 90) -> list[dict]:
    end = time.monotonic() + timeout
    infos: list[dict] = []
    while time.monotonic() < end:
        infos = _programs(proc, run_dir)
        if infos and done(infos):
            return infos
        time.sleep(0.2)
    raise AssertionError(f"not {what} within {timeout}s: {[(i['name'], i['statename']) for i in infos]}")


@pytest.mark.parametrize("case", ["config error (exit 2)", "unmigrated database (exit 4)"])
def test_supervisord_does_not_restart_a_program_that_cannot_start(tmp_path, case, request):
    """A configuration error or an unmigrated database is final: each program runs once, ends with
    its exit code (EXITED, an expected exit), and is neither restarted nor left flapping."""
    if case.startswith("config"):
        env, code = {"CHRONOS_HOLD_TIME_MS": "soon"}, EXIT_CONFIG
        expected = "CHRONOS_HOLD_TIME_MS must be a whole number"
    else:
        env = {"CHRONOS_DATABASE_URL": request.getfixturevalue("empty_database_url"),
               "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": request.getfixturevalue("broker").bootstrap_servers}
        code, expected = EXIT_SCHEMA, "run `chronos migrate` first"
    proc, run_dir = _supervise(tmp_path, **env)
    try:
        infos = _wait_programs(proc, run_dir, lambda infos: all(i["statename"] == "EXITED" for i in infos),
                               "all EXITED")
        time.sleep(2)  # nothing is started again
        log = (tmp_path / "logs" / "supervisord.log").read_text()
        for info in _programs(proc, run_dir):
            name = info["name"]
            assert (info["statename"], info["exitstatus"]) == ("EXITED", code), info
            assert Path(info["stdout_logfile"]).read_text().count(expected) == 1, name
            assert f"exited: {name} (exit status {code}; expected)" in log
            assert log.count(f"spawned: '{name}'") == 1
        assert len(infos) == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_a_program_that_keeps_crashing_is_restarted_with_growing_waits(tmp_path, chronos_env):
    """Crashes in a row (here SIGKILL, as by the OOM killer, right after each start) are restarted
    every time, none given up on (never FATAL, so `chronos up` goes on), each after a longer wait."""
    proc, run_dir = _supervise(tmp_path, **chronos_env)
    log_file = tmp_path / "logs" / "firer_00.log"
    try:
        pid = None
        for crash in range(1, 4):
            infos = _wait_programs(proc, run_dir, lambda infos: any(
                i["name"] == "firer_00" and i["statename"] == "RUNNING" and i["pid"] != pid
                and f", pid {i['pid']}," in log_file.read_text() for i in infos), f"firer restarted ({crash})")
            pid = next(i["pid"] for i in infos if i["name"] == "firer_00")
            os.kill(pid, signal.SIGKILL)
        _wait_programs(proc, run_dir, lambda infos: "(3 in a row): waiting 2s before starting" in log_file.read_text(),
                       "the third restart waiting")
        infos = _wait_programs(proc, run_dir, lambda infos: all(i["statename"] == "RUNNING" for i in infos)
                               and "firing from the store" in log_file.read_text().rsplit("(3 in a row)", 1)[1],
                               "firing again")
        log = log_file.read_text()
        assert "the previous run ended in a crash (1 in a row)\n" in log
        assert "the previous run ended in a crash (2 in a row): waiting 1s before starting" in log
        supervisord = (tmp_path / "logs" / "supervisord.log").read_text()
        assert supervisord.count("exited: firer_00 (terminated by SIGKILL; not expected)") == 3
        assert "FATAL" not in supervisord
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    record = orjson.loads((run_dir / "firer_00.run.json").read_bytes())
    assert record["clean"] and record["crashes"] == 3


# -- PostgreSQL TLS settings reach libpq --------------------------------------------------------


def test_postgres_tls_settings_reach_libpq(pg_server, monkeypatch):
    """The embedded PostgreSQL has no TLS: libpq refusing to connect without it proves it got the setting."""
    base = pg_server.url.rsplit("/", 1)[0] + "/postgres"
    with pytest.raises(StoreUnavailable, match="SSL"):
        connect(f"{base}?sslmode=require")
    with pytest.raises(StoreUnavailable, match="SSL was required"):
        connect(f"{base}?sslmode=verify-full&sslrootcert=/nonexistent/root.crt")
    # every other libpq parameter of the URL arrives too
    with connect(f"{base}?sslmode=prefer&options=-c%20statement_timeout%3D4321") as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "4321ms"
    monkeypatch.setenv("PGSSLMODE", "require")  # the libpq variables work as well
    with pytest.raises(StoreUnavailable, match="SSL"):
        connect(base)
    monkeypatch.setenv("PGSSLMODE", "disable")
    with connect(base) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0] is False
