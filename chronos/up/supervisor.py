"""supervisord, which runs the programs of `chronos up`: its configuration, its start, and the one client
of its XML-RPC interface (also what the benchmarks and the tests ask it through)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import xmlrpc.client
from importlib import resources
from pathlib import Path
from typing import cast

from chronos.runtime import orphans


# how long supervisord may take to answer a call; and one that waits for programs to stop or start (each program
# stops within its stopwaitsecs, at most 30 s in supervisord.conf, or is killed)
ANSWER_S = 10.0
STOPPED_S = 60.0


class SupervisorError(Exception):
    """supervisord could not be asked: its socket is not there or not answering, or it answered a fault."""


def supervisord_conf() -> Path:
    """The project's supervisord.conf: beside the source tree, or shipped in the package."""
    beside = Path(__file__).resolve().parent.parent.parent / "supervisord.conf"
    if beside.is_file():
        return beside
    return Path(str(resources.files("chronos") / "supervisord.conf"))


def spawn_supervisord(socket_dir: Path, log_dir: Path, env: dict[str, str], death_signal: int) -> subprocess.Popen:
    """supervisord in the foreground of a session of its own, with the project's configuration; its socket
    in `socket_dir` (an earlier one's removed first), its own errors in `log_dir`/supervisord.err. It gets
    `death_signal` when the calling process dies."""
    sock = socket_dir / "supervisor.sock"
    if sock.exists():
        sock.unlink()
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.supervisord", "-c", str(supervisord_conf()), "-n"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(log_dir / "supervisord.err", "ab"),
        start_new_session=True, preexec_fn=orphans.child_dies_with_us(death_signal))


class Supervisor:
    """A supervisord's XML-RPC interface on its Unix socket. Programs are named `consumer_00`, `firer_01`, ...
    in the groups `consumer`, `firer` and `detector`."""

    def __init__(self, socket: Path | str):
        self.socket = Path(socket)

    def _rpc(self, timeout: float = ANSWER_S) -> xmlrpc.client.ServerProxy:
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=_UnixTransport(self.socket, timeout))

    def programs(self) -> list[dict]:
        """Every program's process info (name, group, statename, pid, exitstatus, start, now, stdout_logfile)."""
        try:
            # XML-RPC answers are untyped; supervisord documents this one as a list of structs
            return cast(list[dict], self._rpc().supervisor.getAllProcessInfo())
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(str(exc)) from exc

    def stop_all(self) -> None:
        """Stop every program at once (gracefully, as supervisord.conf says) and wait until they stopped."""
        self._call("stopAllProcesses", True, timeout=STOPPED_S)

    def start_group(self, group: str) -> None:
        """Start every program of `group` and wait until they run."""
        self._call("startProcessGroup", group, True, timeout=STOPPED_S)

    def stop_group(self, group: str) -> None:
        """Stop every program of `group`, without waiting."""
        self._call("stopProcessGroup", group)

    def stop(self, name: str) -> None:
        """Stop program `name` (e.g. `consumer_00`) and wait until it stopped."""
        self._call("stopProcess", f"{name.rpartition('_')[0]}:{name}", True, timeout=STOPPED_S)

    def _call(self, method: str, *args: object, timeout: float = ANSWER_S) -> None:
        try:
            getattr(self._rpc(timeout).supervisor, method)(*args)
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(str(exc)) from exc


class _UnixTransport(xmlrpc.client.Transport):
    """XML-RPC over supervisord's Unix socket, each call answered within `timeout` seconds or failed."""

    def __init__(self, socket_path: Path, timeout: float):
        super().__init__()
        self.socket_path, self.timeout = socket_path, timeout

    def make_connection(self, host: object) -> http.client.HTTPConnection:
        return _UnixConnection(self.socket_path, self.timeout)  # a proxy of this module's makes one call


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.socket_path))
