"""The fleet's PostgreSQL: a Patroni cluster with synchronous replication, its members on hosts of their own
(db-1, db-2, ...), etcd as its consensus store (on a host of its own with two members, on each member's host
with three, so that a cut-off member leaves a quorum), the application's role and database; and what the
tests ask of it: the leader and the synchronous standby as the client host sees them, backups, and a fresh
cluster restored from one (docs/operations/backups.md)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from kits.fleet.common import ETCD_PORT, PG_PORT, REST_PORT, FleetError, Servers, as_user, plain_env, wait, write_file
from kits.network import Network
from kits.stack import http_get

ETCD = Path("/usr/bin/etcd")
APP_USER = APP_DATABASE = "chronos"
OWNER = "chronos_owner"  # the database's owner, which migrates; the processes run as APP_USER, which owns nothing


class PatroniCluster:
    """`members` 2: etcd on a host of its own (etcd-1); 3: an etcd member on each PostgreSQL host. With
    `archive`, every member archives its finished WAL files into one folder, shared as a network file system
    would be.

    A fleet of cells has a cluster per cell, each with etcd of its own: its members numbered from `first`
    (db-3, db-4 for the second of two-member clusters), its etcd host `etcd_host`, the roles' `passwords` the
    first cluster's (one secret per role for every cell, as one secret store would give them)."""

    def __init__(self, net: Network, servers: Servers, workdir: Path, *, members: int = 2, archive: bool = False,
                 first: int = 1, etcd_host: str = "etcd-1", passwords: dict[str, str] | None = None):
        if members not in (2, 3):
            raise FleetError(f"the fleet's PostgreSQL has 2 or 3 members, not {members}")
        self.net, self.servers, self.workdir = net, servers, workdir
        self.members = [f"db-{first + i}" for i in range(members)]
        self.etcd_hosts = self.members if members == 3 else [etcd_host]
        self.archive = (workdir / ("wal-archive" if first == 1 else f"wal-archive-{self.members[0]}")) if archive \
            else None
        self.passwords = dict(passwords) if passwords else {
            role: secrets.token_hex(12) for role in ("superuser", "replication", "app", "owner")}

    @property
    def hosts(self) -> list[str]:
        """The hosts it needs in the network, etcd's first."""
        return [*([] if self.etcd_hosts == self.members else self.etcd_hosts), *self.members]

    # -- addresses -------------------------------------------------------------------------------

    def database_url(self, user: str = APP_USER) -> str:
        """The multi-host URL by name of `user` (the application's role by default), as the Chronos hosts have it
        (the application's password in pgpass, the owner's in the owner's environment file)."""
        hosts = ",".join(f"{m}:{PG_PORT}" for m in self.members)
        return f"postgresql://{user}@{hosts}/{APP_DATABASE}?target_session_attrs=read-write&connect_timeout=2"

    def url(self, *, admin: bool = False, member: str | None = None) -> str:
        """A URL by address with its password, for the test process (in the client host)."""
        user, password, db = (("postgres", self.passwords["superuser"], "postgres") if admin
                              else (APP_USER, self.passwords["app"], APP_DATABASE))
        hosts = ",".join(f"{self.net[m].address}:{PG_PORT}" for m in ([member] if member else self.members))
        return (f"postgresql://{user}:{password}@{hosts}/{db}?connect_timeout=2"
                + ("" if member else "&target_session_attrs=read-write"))

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """etcd and every member started (the network has their hosts already)."""
        self._start_etcd()
        self._start_members()

    def ready(self, timeout: float) -> None:
        """Until a member leads and a synchronous standby streams; then the application's role and database."""
        self.wait_leader(timeout=max(10.0, timeout))
        self.wait_sync_standby(timeout=60)
        self._app_database()

    def _start_etcd(self) -> None:
        cluster = ",".join(f"etcd-{h}=http://{self.net[h].address}:{ETCD_PORT + 1}" for h in self.etcd_hosts)
        for host in self.etcd_hosts:
            a = self.net[host].address
            data = self.workdir / host / "etcd"
            data.mkdir(parents=True, exist_ok=True)
            os.chmod(data, 0o700)
            self.servers.spawn(f"etcd-{host}", host, [
                str(ETCD), "--name", f"etcd-{host}", "--data-dir", str(data),
                "--listen-client-urls", f"http://{a}:{ETCD_PORT}", "--advertise-client-urls", f"http://{a}:{ETCD_PORT}",
                "--listen-peer-urls", f"http://{a}:{ETCD_PORT + 1}",
                "--initial-advertise-peer-urls", f"http://{a}:{ETCD_PORT + 1}",
                "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "chronos-fleet",
                "--logger", "zap", "--log-outputs", "stderr"])

    def _start_members(self) -> None:
        from chronos.embedded.patroni import patroni_command
        from chronos.embedded.postgres import ensure_traversable, postgres_bin_dir, server_user
        user = server_user()
        if user is None:
            raise FleetError("the fleet runs as root (namespaces), so PostgreSQL has a user of its own")
        bin_dir, command = postgres_bin_dir(), patroni_command()
        ensure_traversable(bin_dir)
        ensure_traversable(command)
        if self.archive is not None:
            self.archive.mkdir(parents=True, exist_ok=True)
            os.chown(self.archive, *user)
        for name in self.members:
            self._start_member(name)

    def member_config(self, name: str, bootstrap: dict[str, Any] | None = None) -> Path:
        """Write the member's Patroni configuration (with a bootstrap method of `bootstrap`'s, for a cluster
        made from a backup); its path."""
        from chronos.embedded.patroni import patroni_config
        from chronos.embedded.postgres import ensure_traversable, postgres_bin_dir, server_user
        user = server_user()
        assert user is not None
        node = self.workdir / name / "pg"
        node.mkdir(parents=True, exist_ok=True)
        ensure_traversable(node)
        etcd = [f"{self.net[h].address}:{ETCD_PORT}" for h in self.etcd_hosts]
        config = patroni_config(name=name, pg_port=PG_PORT, restapi_port=REST_PORT, etcd_port=ETCD_PORT,
                                node_dir=node, bin_dir=postgres_bin_dir(), passwords=self.passwords, ttl=20, loop_wait=1,
                                retry_timeout=4, strict=False, fast=True, host=self.net[name].address,
                                etcd_hosts=etcd, clients=str(self.net.net))
        if self.archive is not None:
            config["postgresql"]["parameters"].update(
                archive_mode="on", archive_command=f"test ! -f {self.archive}/%f && cp %p {self.archive}/%f")
        if bootstrap is not None:
            config["bootstrap"].update(bootstrap)
        path = node / "patroni.yml"
        write_file(path, json.dumps(config, indent=2), 0o600)
        for p in (node, path):
            os.chown(p, *user)
        os.chmod(node, 0o700)
        return path

    def _start_member(self, name: str, bootstrap: dict[str, Any] | None = None) -> None:
        from chronos.embedded.patroni import patroni_command
        from chronos.embedded.postgres import server_user
        user = server_user()
        assert user is not None
        path = self.member_config(name, bootstrap)
        self.servers.spawn(name, name, as_user(user, [str(patroni_command()), str(path)]),
                           plain_env(HOME=str(path.parent), LC_ALL="C"))

    def as_server_user(self, host: str, argv: list[str], *, timeout: float = 120.0,
                       input: str | None = None) -> subprocess.CompletedProcess:
        """A command run in `host`'s network as PostgreSQL's user (the members' files are its)."""
        from chronos.embedded.postgres import server_user
        user = server_user()
        assert user is not None
        return subprocess.run(self.net.command(host, as_user(user, argv)), capture_output=True, text=True,
                              timeout=timeout, input=input, env=plain_env(HOME=str(self.workdir), LC_ALL="C"), cwd="/")

    def _app_database(self) -> None:
        """The database and its two roles, as the production checklist's least-privilege role says: the owner,
        which migrates, and the application's, which reads and writes the rows of the owner's tables."""
        import psycopg
        from psycopg import sql
        owner, app = sql.Identifier(OWNER), sql.Identifier(APP_USER)
        with self.net.inside("client"):
            with psycopg.connect(self.url(admin=True), autocommit=True) as conn:
                for role, password in ((owner, self.passwords["owner"]), (app, self.passwords["app"])):
                    conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(role, sql.Literal(password)))
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(APP_DATABASE), owner))
                conn.execute(sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
                    sql.Identifier(APP_DATABASE), app))
            with psycopg.connect(self.url(admin=True).replace("/postgres?", f"/{APP_DATABASE}?"),
                                 autocommit=True) as conn:
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(app))
                conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA public "
                                     "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}").format(owner, app))

    # -- Patroni, as the client host sees it --------------------------------------------------------

    def rest(self, member: str, path: str, timeout: float = 2.0) -> Any:
        """A member's REST API answer (decoded JSON), asked from the client host; None when it does not answer."""
        with self.net.inside("client"):
            status, body = http_get(f"http://{self.net[member].address}:{REST_PORT}{path}", timeout)
        if status == 0:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def cluster(self, exclude: tuple[str, ...] = ()) -> list[dict[str, Any]] | None:
        for member in self.members:
            if member in exclude:
                continue
            answer = self.rest(member, "/cluster", timeout=1.0)
            if isinstance(answer, dict):
                return list(answer.get("members", []))
        return None

    def leader(self, exclude: tuple[str, ...] = ()) -> str | None:
        """The member whose PostgreSQL is the writable leader, as the members that answer (not `exclude`) say."""
        for m in self.cluster(exclude) or []:
            if m.get("role") == "leader" and m.get("state") == "running" and m["name"] not in exclude:
                answer = self.rest(m["name"], "/patroni", timeout=1.0)
                if isinstance(answer, dict) and answer.get("role") == "primary" and answer.get("state") == "running":
                    return m["name"]
        return None

    def wait_leader(self, not_name: str | None = None, timeout: float = 90.0) -> tuple[str, float]:
        """(leader, when it was first seen so) once a member other than `not_name` leads and takes writes."""
        exclude = (not_name,) if not_name else ()
        name = wait(lambda: self.leader(exclude), timeout, f"a leader other than {not_name}" if not_name else "a leader",
                    every=0.05)
        return name, time.time()

    def sync_standby(self) -> str | None:
        for m in self.cluster() or []:
            if m.get("role") == "sync_standby" and m.get("state") == "streaming":
                return m["name"]
        return None

    def wait_sync_standby(self, timeout: float = 90.0) -> str:
        return wait(self.sync_standby, timeout, "a synchronous standby streaming", every=0.2)

    def wait_streaming(self, member: str, timeout: float) -> float | None:
        """When `member` runs as a streaming replica again (None if not within `timeout`)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for m in self.cluster() or []:
                if m["name"] == member and m.get("role") in ("replica", "sync_standby") and m.get("state") == "streaming":
                    return time.time()
            time.sleep(0.2)
        return None

    # -- backups and a restore into a fresh cluster (Backups and restore) ------------------------------

    def base_backup(self, dest: Path) -> None:
        """`pg_basebackup` of the leader, from the client host, as the replication user."""
        from chronos.embedded.patroni import REPLICATION_USER
        from chronos.embedded.postgres import postgres_bin_dir
        leader = self.leader()
        if leader is None:
            raise FleetError("no leader to back up")
        done = self.as_server_user("client", [
            "env", f"PGPASSWORD={self.passwords['replication']}", str(postgres_bin_dir() / "pg_basebackup"),
            "--host", self.net[leader].address, "--port", str(PG_PORT), "--username", REPLICATION_USER,
            "--pgdata", str(dest), "--checkpoint=fast", "--wal-method=stream"])
        if done.returncode != 0:
            raise FleetError(f"pg_basebackup failed: {done.stderr}")

    def kill_member(self, member: str) -> None:
        """The member killed outright, as a host that loses power: its Patroni and its PostgreSQL (the postmaster,
        whose children end with it), SIGKILL."""
        pid_file = self.workdir / member / "pg" / "data" / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        proc = self.servers[member].popen
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)
        proc.wait(10)

    def start_member(self, member: str) -> None:
        """A member started again (after `kill_member`): Patroni brings it back as a standby."""
        self._start_member(member)

    def stop_members(self, timeout: float = 60.0) -> None:
        """Patroni stopped on every member (its PostgreSQL with it), as `systemctl stop patroni` does."""
        for name in self.members:
            self.servers[name].popen.terminate()
        for name in self.members:
            self.servers[name].popen.wait(timeout)

    def patronictl(self, member: str, *args: str, input: str | None = None) -> str:
        from chronos.embedded.patroni import patroni_command
        ctl = patroni_command().parent / "patronictl"
        done = self.as_server_user(member, [str(ctl), "-c", str(self.workdir / member / "pg" / "patroni.yml"), *args],
                                   input=input)
        if done.returncode != 0:
            raise FleetError(f"patronictl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def restore_cluster(self, bootstrap: dict[str, Any], timeout: float = 120.0) -> str:
        """A fresh cluster made from a backup, as Backups and restore says for Patroni: every member
        stopped, the cluster's keys removed from etcd, every data directory moved aside, the first member
        started with `bootstrap` (a method that makes its data directory from the backup and replays the
        archive), the others once it leads (each copies it). The leader."""
        from chronos.embedded.patroni import SCOPE
        self.stop_members()
        self.patronictl(self.members[0], "remove", SCOPE, input=f"{SCOPE}\nYes I am aware\n")
        for name in self.members:
            data = self.workdir / name / "pg" / "data"
            if data.exists():
                data.rename(data.with_name(f"data.before-restore-{int(time.time())}"))
        self._start_member(self.members[0], bootstrap)
        leader, _ = self.wait_leader(timeout=timeout)
        for name in self.members[1:]:
            self._start_member(name)
        self.wait_sync_standby(timeout=timeout)
        return leader
