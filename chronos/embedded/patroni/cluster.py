"""`ReplicatedPostgres`: etcd and Patroni members on 127.0.0.1, started, stopped and hurt as one cluster."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from chronos.embedded.patroni.bootstrap import create_app_database
from chronos.embedded.patroni.config import (APP_DATABASE, APP_USER, MIN_TTL, PG_PROGRAMS, Leader, Member,
                                             patroni_command, patroni_config, rest)
from chronos.embedded.patroni.nodes import EtcdServer, PatroniMember
from chronos.embedded.patroni.restview import RestView
from chronos.embedded.patroni.state import ClusterState
from chronos.embedded.postgres import PG_SUPERUSER, ensure_traversable, postgres_bin_dir, server_user
from chronos.embedded.procs import HOST, EmbeddedError
from chronos.errors import ConfigError
from chronos.runtime import orphans

log = logging.getLogger("chronos.embedded.patroni")


class ReplicatedPostgres(RestView):
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
        self._state = ClusterState(self.workdir / "cluster.json", self.names, base_port)
        self._passwords = self._state.passwords
        self._ports = self._state.ports
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
            self._state.save()
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
            create_app_database(self.admin_url, self._passwords["app"])
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

    # -- inside -------------------------------------------------------------------------------

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
