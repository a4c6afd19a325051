"""supervisord, which runs the programs of `chronos up`: its configuration, its start, and the one client
of its XML-RPC interface (also what the benchmarks and the tests ask it through)."""

from __future__ import annotations

import subprocess
import sys
import xmlrpc.client
from importlib import resources
from pathlib import Path
from typing import cast

from chronos.runtime import orphans


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

    def _rpc(self) -> xmlrpc.client.ServerProxy:
        from supervisor.xmlrpc import SupervisorTransport
        transport = SupervisorTransport(None, None, f"unix://{self.socket}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def programs(self) -> list[dict]:
        """Every program's process info (name, group, statename, pid, exitstatus, start, now, stdout_logfile)."""
        try:
            # XML-RPC answers are untyped; supervisord documents this one as a list of structs
            return cast(list[dict], self._rpc().supervisor.getAllProcessInfo())
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(str(exc)) from exc

    def stop_all(self) -> None:
        """Stop every program (gracefully, as supervisord.conf says) and wait until they stopped."""
        self._call("stopAllProcesses", True)

    def start_group(self, group: str) -> None:
        """Start every program of `group` and wait until they run."""
        self._call("startProcessGroup", group, True)

    def stop_group(self, group: str) -> None:
        """Stop every program of `group`, without waiting."""
        self._call("stopProcessGroup", group)

    def stop(self, name: str) -> None:
        """Stop program `name` (e.g. `consumer_00`) and wait until it stopped."""
        self._call("stopProcess", f"{name.rpartition('_')[0]}:{name}", True)

    def _call(self, method: str, *args: object) -> None:
        try:
            getattr(self._rpc().supervisor, method)(*args)
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(str(exc)) from exc
