"""What every part of the fleet shares: its ports, its errors, waiting for a condition, a root shell's plain
environment, and the servers it started (each in a host of the fleet's network)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kits.network import Network

ROOT = Path(__file__).resolve().parents[2]
PG_PORT, REST_PORT, ETCD_PORT, KAFKA_PORT, METRICS_PORT, PROMETHEUS_PORT = 5432, 8008, 2379, 9092, 9400, 9090


class FleetError(RuntimeError):
    pass


def write_file(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def wait(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """The first truthy answer of `condition`, asked every `every` s; a FleetError naming `what` (and the last
    answer) when none comes within `timeout`."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = condition()
        if last:
            return last
        time.sleep(every)
    raise FleetError(f"{what}: not within {timeout:.0f}s (last: {last!r})")


def tell(fifo: Path, text: str, timeout: float = 10.0) -> None:
    """Write `text` to a FIFO once its reader has it open (within `timeout`; a reader gone is not waited for
    longer)."""
    end = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:  # ENXIO: no reader yet
            if time.monotonic() > end:
                raise FleetError(f"nobody reads {fifo}: {exc}") from None
            time.sleep(0.05)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def as_user(user: tuple[int, int], argv: list[str]) -> list[str]:
    """`argv` run as `user` (uid, gid) with no supplementary groups."""
    return ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--", *argv]


def plain_env(**extra: str) -> dict[str, str]:
    """A root shell's environment: nothing of this test run's (its virtual environment, CHRONOS_*)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
           "HOME": "/root"}
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    return {**env, **extra}


@dataclass
class Proc:
    """A server the fleet started in a host."""

    name: str
    host: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class Servers:
    """The servers the fleet started (etcd, the Patroni members, the broker, Prometheus), each in a host of
    `net`, each logging to a file of its own under `logs`."""

    def __init__(self, net: Network, logs: Path):
        self.net, self.logs = net, logs
        self.procs: dict[str, Proc] = {}

    def spawn(self, name: str, host: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        popen = subprocess.Popen(self.net.command(host, argv), stdin=subprocess.DEVNULL, stdout=open(log, "ab"),
                                 stderr=subprocess.STDOUT, env=env or plain_env(), start_new_session=True)
        proc = self.procs[name] = Proc(name, host, popen, log)
        return proc

    def __contains__(self, name: str) -> bool:
        return name in self.procs

    def __getitem__(self, name: str) -> Proc:
        return self.procs[name]

    def kill_all(self) -> None:
        """Whatever still runs, killed (the network's close has ended them already, as a rule)."""
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait(5)
