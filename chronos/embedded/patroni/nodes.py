"""etcd and a Patroni member as processes of their own: started, stopped, killed or frozen whole, as
servers die or hang."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from chronos.embedded.patroni.config import ETCD, SCOPE, rest
from chronos.embedded.postgres import user_kwargs
from chronos.embedded.procs import HOST, EmbeddedError, ServerProcess, descendants, port_in_use, proc_stat

log = logging.getLogger("chronos.embedded.patroni")


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
