"""A connection pooler for the tests: Debian's PgBouncer (the Makefile's `pgbouncer` target installs it) in
front of the test PostgreSQL, in session or transaction mode.

PgBouncer refuses to run as root, so under root it runs as the user that runs the embedded PostgreSQL
(`chronos.embedded.postgres.server_user`), from a directory of its own under /tmp that this user owns (its
configuration, user list, log, pid file and unix socket). It listens on 127.0.0.1 on a free port, lets every
user of the user list in without a password (`auth_type = trust`, like the test PostgreSQL) and sends every
database to the test PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg.rows import dict_row

from chronos.embedded.postgres import PG_SUPERUSER, server_user, user_kwargs
from chronos.embedded.procs import HOST, free_port, tcp_accepts

PGBOUNCER = Path("/usr/sbin/pgbouncer")


def require_pgbouncer() -> Path:
    """Debian's pgbouncer, or the test fails saying how to install it."""
    if not PGBOUNCER.is_file():
        pytest.fail(f"Debian's PgBouncer is not installed at {PGBOUNCER}: run `make test` as root, "
                    "or apt-get install pgbouncer")
    return PGBOUNCER


class PgBouncer:
    """pgbouncer in `pool_mode` in front of the PostgreSQL on 127.0.0.1:`target_port`; `url(database_url)`
    is a URL of the same database through it. `settings` adds or overrides lines of its [pgbouncer]
    section (such as `server_round_robin`)."""

    def __init__(self, target_port: int, pool_mode: str, **settings: str):
        self.target_port, self.pool_mode, self.settings = target_port, pool_mode, settings
        self.port = 0
        self.directory: Path | None = None
        self.proc: subprocess.Popen | None = None

    def url(self, database_url: str) -> str:
        """`database_url` with this pooler's address in place of the server's."""
        parts = urlsplit(database_url)
        userinfo = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{userinfo}@{HOST}:{self.port}" if userinfo else f"{HOST}:{self.port}"))

    @property
    def log(self) -> str:
        path = self.directory / "pgbouncer.log" if self.directory else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    def start(self, attempts: int = 3) -> "PgBouncer":
        binary = require_pgbouncer()
        user = server_user()
        self.directory = Path(tempfile.mkdtemp(prefix="chronos-pgbouncer-"))
        (self.directory / "userlist.txt").write_text(f'"{PG_SUPERUSER}" ""\n')
        if user is not None:
            for path in (self.directory, self.directory / "userlist.txt"):
                os.chown(path, *user)
        for _ in range(attempts):  # a free port may be taken by someone else before pgbouncer binds it
            self.port = free_port()
            conf = self.directory / "pgbouncer.ini"
            conf.write_text(self._config())
            self.proc = subprocess.Popen([str(binary), str(conf)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT, cwd=self.directory, **user_kwargs(user))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None and not tcp_accepts(self.port):
                time.sleep(0.02)
            if self.proc.poll() is None and tcp_accepts(self.port):
                return self
            self.stop(keep_directory=True)
        raise RuntimeError(f"pgbouncer did not start: {self.log[-2000:]}")

    def _config(self) -> str:
        assert self.directory is not None
        settings = {
            "listen_addr": HOST, "listen_port": str(self.port), "unix_socket_dir": str(self.directory),
            "auth_type": "trust", "auth_file": str(self.directory / "userlist.txt"),
            "pool_mode": self.pool_mode, "default_pool_size": "10", "max_client_conn": "200",
            "logfile": str(self.directory / "pgbouncer.log"), "pidfile": str(self.directory / "pgbouncer.pid"),
            "admin_users": PG_SUPERUSER,
            # libpq and psycopg send nothing else PgBouncer would refuse
            "ignore_startup_parameters": "extra_float_digits",
            **self.settings,
        }
        lines = ["[databases]", f"* = host={HOST} port={self.target_port}", "", "[pgbouncer]"]
        return "\n".join(lines + [f"{key} = {value}" for key, value in settings.items()]) + "\n"

    def admin(self, command: str) -> list[dict]:
        """A command of PgBouncer's admin console (`SHOW POOLS`, `SHOW SERVERS`, ...): its rows, by column."""
        with psycopg.connect(f"postgresql://{PG_SUPERUSER}@{HOST}:{self.port}/pgbouncer", autocommit=True,
                             prepare_threshold=None, row_factory=dict_row) as conn:
            cur = conn.execute(command)
            return cur.fetchall() if cur.description else []

    def server_pids(self, database: str) -> set[int]:
        """The backend pids of the server connections the pooler holds to `database`."""
        return {r["remote_pid"] for r in self.admin("SHOW SERVERS") if r["database"] == database}

    def stop(self, *, keep_directory: bool = False) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()  # SIGTERM: PgBouncer's immediate shutdown
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if self.directory is not None and not keep_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> "PgBouncer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
