"""What every part of the Patroni kit shares: its names and limits, the Patroni program, one member's
configuration, the REST API client, and the records of a member and of a leader."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from chronos.embedded.postgres import PG_SUPERUSER
from chronos.embedded.procs import HOST, EmbeddedError

ETCD = Path("/usr/bin/etcd")
PATRONI_ENV = "CHRONOS_PATRONI"   # the patroni program, or the virtual environment that holds it
PATRONI_VENV = ".patroni-venv"    # made by `make patroni` in the source tree
SCOPE = "chronos"                 # Patroni's cluster name; its keys live under /chronos/ in etcd
APP_USER = APP_DATABASE = "chronos"
REPLICATION_USER = "replicator"
PG_PROGRAMS = ("postgres", "initdb", "pg_ctl", "pg_controldata", "pg_basebackup", "pg_rewind")
MIN_TTL = 20  # Patroni 4 raises a smaller ttl to 20 s: a smaller one here would only say what does not happen
POLL = 0.05   # how often the waits ask the REST API: a failover's time is measured to about this


class Leader(NamedTuple):
    """A member that leads the cluster, and when it was first seen doing so (time.time())."""

    name: str
    at: float


@dataclass(frozen=True)
class Member:
    """What a client or a fault test needs to know of one member, as it is now."""

    name: str
    pg_port: int
    restapi_port: int
    data_dir: Path
    patroni_pid: int | None
    postmaster_pid: int | None


def patroni_command() -> Path:
    """The `patroni` program: $CHRONOS_PATRONI (the program or its virtual environment), else the
    `.patroni-venv` that `make patroni` makes in the source tree or the current directory, else PATH."""
    given = os.environ.get(PATRONI_ENV)
    if given:
        path = Path(given)
        program = path / "bin" / "patroni" if path.is_dir() else path
        if not os.access(program, os.X_OK):
            raise EmbeddedError(f"{PATRONI_ENV}={given} is neither the patroni program nor a virtual "
                                "environment holding it")
        return program.absolute()
    source_tree = Path(__file__).resolve().parents[3]
    for base in (source_tree, Path.cwd()):
        program = base / PATRONI_VENV / "bin" / "patroni"
        if os.access(program, os.X_OK):
            return program
    found = shutil.which("patroni")
    if found:
        return Path(found)
    raise EmbeddedError("Patroni is not installed: run `make patroni` (or set CHRONOS_PATRONI to its program)")

def patroni_config(*, name: str, pg_port: int, restapi_port: int, etcd_port: int, node_dir: Path,
                   bin_dir: Path, passwords: dict[str, str], ttl: int, loop_wait: int, retry_timeout: int,
                   strict: bool, fast: bool, host: str = HOST, etcd_hosts: list[str] | None = None,
                   clients: str | None = None) -> dict[str, Any]:
    """One member's Patroni configuration (written as JSON, which YAML reads).

    The member listens on `host` and finds etcd at `etcd_hosts` (`host:port` each; by default etcd on
    `HOST`:`etcd_port`); `clients` is the network its peers and clients come from (`host`/32 by default).

    The settings under `bootstrap.dcs` are the cluster's, stored in etcd by the member that initializes
    it. `synchronous_commit` keeps its default (on): a commit returns once the synchronous standby has
    flushed it, so `fast` turns off fsync only. `full_page_writes` and `wal_log_hints` stay on because
    pg_rewind needs them to bring a failed primary back as a standby.
    """
    local = {
        "listen_addresses": host,
        "unix_socket_directories": "",  # TCP only: no socket file in /tmp for each member
        "logging_collector": "off",     # PostgreSQL's output goes to Patroni's, in the member's log
        "log_destination": "stderr",
        # a standby asks again for WAL it lacks every second, not every 5: after a start or a failover
        # it streams, and commits are synchronous again, seconds sooner
        "wal_retrieve_retry_interval": "1s",
    }
    if fast:
        local["fsync"] = "off"
    return {
        "scope": SCOPE,
        "namespace": "/chronos/",
        "name": name,
        "restapi": {"listen": f"{host}:{restapi_port}", "connect_address": f"{host}:{restapi_port}"},
        "etcd3": {"hosts": etcd_hosts or [f"{HOST}:{etcd_port}"], "protocol": "http"},
        "bootstrap": {
            "dcs": {
                "ttl": ttl, "loop_wait": loop_wait, "retry_timeout": retry_timeout,
                "maximum_lag_on_failover": 1024 * 1024,
                "synchronous_mode": True,
                "synchronous_mode_strict": strict,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "max_connections": 200,
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "wal_keep_size": "128MB",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
        },
        "postgresql": {
            "listen": f"{host}:{pg_port}",
            "connect_address": f"{host}:{pg_port}",
            "data_dir": str(node_dir / "data"),
            "bin_dir": str(bin_dir),
            "pgpass": str(node_dir / "pgpass"),
            "authentication": {
                "superuser": {"username": PG_SUPERUSER, "password": passwords["superuser"]},
                "replication": {"username": REPLICATION_USER, "password": passwords["replication"]},
            },
            "parameters": local,
            "pg_hba": [
                f"host replication {REPLICATION_USER} {clients or host + '/32'} scram-sha-256",
                f"host all all {clients or host + '/32'} scram-sha-256",
            ],
            "use_pg_rewind": True,
            # a rewind that cannot work (or a timeline that went another way) ends in a fresh copy of
            # the leader instead of a member that stays down
            "remove_data_directory_on_rewind_failure": True,
            "remove_data_directory_on_diverged_timelines": True,
            "basebackup": [{"checkpoint": "fast"}],
        },
        "log": {"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
    }


def rest(port: int, path: str, *, body: dict | None = None, timeout: float = 3.0, host: str = HOST) -> tuple[int, Any]:
    """(HTTP status, decoded JSON or text) of a Patroni REST API request; OSError when it does not answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method="POST" if body else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as e:  # 503 and friends are answers too
        status, raw = e.code, e.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text
