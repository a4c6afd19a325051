"""Chronos and PostgreSQL over TLS that checks the server's certificate (sslmode=verify-full), as the
least-privilege role production runs it as: the processes work, every refusal (a certificate no trusted
authority signed, another host's certificate, no root certificate, a wrong password, no TLS) is one line
and a final exit, a password change and a rotated server certificate are picked up by the running
processes, and the password never shows."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from helpers import Collector, chronos_headers, producer, send
from kits.tls import APP_PASSWORD, APP_ROLE, Authority, app_url

from chronos.errors import EXIT_CONFIG

CHRONOS = [sys.executable, "-m", "chronos"]
ROLES = ("consumer", "firer", "detector")


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("CHRONOS_", "PG"))}, **extra}


def _app_backends(database_url: str) -> list[tuple[str, bool]]:
    """(application name, TLS or not) of every connection `chronos_app` has open."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute("SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                            "WHERE a.usename = %s", (APP_ROLE,)).fetchall()


def _deliver(broker, topics, tag: str, count: int = 10) -> None:
    """Send `count` messages due in half a second; wait until all of them arrive on the output topic."""
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    try:
        p = producer(broker.bootstrap_servers)
        for i in range(count):
            send(p, topics["input"], b"k", f"{tag}-{i}".encode(), chronos_headers(f"{tag}-{i}", time.time() + 0.5))
        p.flush(10)
        wanted = {f"{tag}-{i}".encode() for i in range(count)}
        collect.until(lambda ms: {m.value for m in ms} >= wanted, timeout=60)
    finally:
        collect.close()


def test_the_processes_and_status_work_over_verified_tls_as_a_least_privilege_role(
        processes, broker, topics, database_url, authority):
    url = app_url(database_url, authority.ca_file)
    procs = [processes.start(role, CHRONOS_DATABASE_URL=url, CHRONOS_LOG_LEVEL="debug") for role in ROLES]
    for proc in procs:
        processes.wait_for_log(proc, "starting: node")
    _deliver(broker, topics, "tls")
    backends = _app_backends(database_url)
    # each process's sessions carry its role and node id
    assert {name.rsplit(" ", 1)[0] for name, _ in backends} >= {"chronos consumer", "chronos firer", "chronos detector"}
    assert all(name.startswith("chronos") for name, _ in backends), backends
    assert all(ssl for _, ssl in backends), backends
    status = subprocess.run(CHRONOS + ["status", "--json", "--database-url", url], env=_env(), capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    for proc in procs:
        assert proc.poll() is None
        assert APP_PASSWORD not in processes.log_of(proc)
    assert APP_PASSWORD not in status.stdout + status.stderr


def _refusals(database_url: str, authority: Authority, other: Authority, tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Settings PostgreSQL or libpq refuse: name -> (URL, what the error says)."""
    return {
        "a certificate of another authority": (app_url(database_url, other.ca_file), "certificate verify failed"),
        "another host's certificate": (app_url(database_url, authority.ca_file, host="localhost"),
                                       'does not match host name "localhost"'),
        "no root certificate": (app_url(database_url, tmp_path / "missing-root.crt"), "root certificate file"),
        "a wrong password": (app_url(database_url, authority.ca_file, password="Wrong-" + APP_PASSWORD),
                             "password authentication failed"),
        "no TLS": (app_url(database_url, authority.ca_file, sslmode="disable"), "pg_hba.conf rejects connection"),
    }


def test_every_refusal_is_one_line_and_final_and_never_shows_the_password(tmp_path, processes, database_url,
                                                                          authority):
    """`chronos status` and `migrate` say what was refused in one line (exit 2); a process refused at start
    logs it once and exits 2 (supervisord does not restart it), instead of retrying forever."""
    other = Authority("other", tmp_path / "other")
    cases = _refusals(database_url, authority, other, tmp_path)
    commands = {(name, command): subprocess.Popen(CHRONOS + [command, "--database-url", url], env=_env(),
                                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name, (url, _) in cases.items() for command in ("status", "migrate")}
    refused = {name: processes.start(role, CHRONOS_DATABASE_URL=cases[name][0])
               for name, role in (("a certificate of another authority", "consumer"), ("a wrong password", "firer"),
                                  ("another host's certificate", "detector"))}
    for (name, command), proc in commands.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == EXIT_CONFIG, (name, command, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (name, command, err)
        assert err.startswith(f"chronos {command}: PostgreSQL at ") and "refused the connection" in err, err
        assert cases[name][1] in err, (name, err)
        assert APP_PASSWORD not in out + err, (name, command)
    for name, proc in refused.items():
        assert proc.wait(30) == EXIT_CONFIG, (name, processes.log_of(proc))
        log = processes.log_of(proc)
        assert log.count("refused the connection") == 1 and cases[name][1] in log, (name, log)
        assert "Traceback" not in log and APP_PASSWORD not in log, name


def test_a_password_change_and_a_rotated_certificate_are_picked_up_without_a_restart(
        tmp_path, processes, broker, topics, database_url, pg_server, authority):
    """The password in a libpq password file (`passfile=`), which libpq reads at every connection: after
    the password changes (and the file with it), the running processes reconnect with the new one. After
    the server's certificate rotates to one of a new authority (the root certificate file trusting both,
    as a rotation does first), they verify the new one. Neither needs a restart."""
    passfile = tmp_path / "pgpass"
    port = pg_server.port
    passfile.write_text(f"127.0.0.1:{port}:*:{APP_ROLE}:{APP_PASSWORD}\n")
    passfile.chmod(0o600)  # libpq ignores a password file others may read
    roots = tmp_path / "roots.pem"
    roots.write_bytes(authority.ca_file.read_bytes())
    url = app_url(database_url, roots, password=None, passfile=str(passfile))
    procs = [processes.start(role, CHRONOS_DATABASE_URL=url) for role in ROLES]
    for proc in procs:
        processes.wait_for_log(proc, "starting: node")
    _deliver(broker, topics, "before")

    new_password = "Changed-S3cret-pw-2"
    new_authority = Authority("rotated", tmp_path / "rotated")
    roots.write_bytes(authority.ca_file.read_bytes() + new_authority.ca_file.read_bytes())
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {APP_ROLE} PASSWORD '{new_password}'")
        passfile.write_text(f"127.0.0.1:{port}:*:{APP_ROLE}:{new_password}\n")
        pg_server.install_tls(*new_authority.issue("postgres-rotated"))
        pg_server.reload()
        # PostgreSQL keeps the sessions it authenticated: end them, as a restart or a network cut would
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (APP_ROLE,))
    try:
        _deliver(broker, topics, "after")
        # the server shows the new certificate: only the new authority verifies it now
        with psycopg.connect(app_url(database_url, new_authority.ca_file, password=new_password)) as conn:
            assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
        backends = _app_backends(database_url)
        assert len(backends) >= 4 and all(ssl for _, ssl in backends), backends
        for proc in procs:
            assert proc.poll() is None, processes.log_of(proc)
            log = processes.log_of(proc)
            assert APP_PASSWORD not in log and new_password not in log
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {APP_ROLE} PASSWORD '{APP_PASSWORD}'")
        pg_server.install_tls(*authority.issue("postgres"))
        pg_server.reload()
