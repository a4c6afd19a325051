"""Processes that die with their parent, and the ones an earlier `chronos up` left behind.

`chronos up` is the parent of the embedded PostgreSQL, the broker and supervisord, and
supervisord is the parent of the programs. When a parent is killed outright (SIGKILL, the OOM
killer) its children must not live on, holding the data directory and publishing into a broker
nobody reads: on Linux each child asks the kernel for a signal when its parent dies
(PR_SET_PDEATHSIG). Whatever survives anyway (another OS, a child still stopping) carries the
data directory in its environment (`STACK_ENV`), so the next `chronos up` of that directory
finds it and stops it. A lock file held for the life of `chronos up` tells a live owner from a
dead one: the kernel releases it however the process ends.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("chronos.orphans")

STACK_ENV = "CHRONOS_STACK_DIR"  # set by `chronos up` for everything it starts: the data directory
_PR_SET_PDEATHSIG = 1


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as exc:
        log.warning("prctl is not available (%s): children will not die with their parent", exc)
        return None


_PRCTL = _load_prctl()


def die_with_parent(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux); whether it is set.

    The kernel sends it when the parent *thread* that started this process ends: call it in a
    process whose parent starts its children from its main thread.
    """
    if _PRCTL is None:
        return False
    return _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def child_dies_with_us(sig: int) -> Callable[[], None] | None:
    """A `preexec_fn` for Popen: the child gets `sig` when this process dies (None where unsupported).

    A child whose parent died before it could ask exits at once instead of running orphaned.
    """
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        die_with_parent(sig)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def parent_alive_after_asking(sig: int) -> bool:
    """In a program: ask for `sig` when the parent (supervisord) dies; False if it already has."""
    parent = os.getppid()
    if not die_with_parent(sig):
        return True
    # reparented (to init or a subreaper) before the request took effect: the parent is gone
    return parent != 1 and os.getppid() == parent


def stop_child(proc: subprocess.Popen, timeout: float) -> None:
    """Stop a child that leads its own process group: SIGTERM, then SIGKILL to the whole group if it
    has not exited within `timeout` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class StackLock:
    """An exclusive lock on a data directory, held while its `chronos up` lives.

    The file also names the owner's pid, for the message a second `chronos up` gives.
    """

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock; False if a live process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    @property
    def held(self) -> bool:
        return self._fd is not None

    def owner(self) -> str:
        """The pid the holder wrote (as text), or "unknown"."""
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class Leftover:
    """A process of a stack whose `chronos up` is gone."""

    pid: int
    command: str

    def __str__(self) -> str:
        return f"{self.command} (pid {self.pid})"


def _marked(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:  # gone, or another user's process (ours run as us, or are readable to root)
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has exited
    except (OSError, IndexError):
        return False


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    if not argv:
        return "?"
    text = " ".join([os.path.basename(argv[0]), *argv[1:]])
    return text if len(text) <= 60 else text[:57] + "..."


def leftovers(data_dir: Path) -> list[Leftover]:
    """Live processes, other than this one, that a `chronos up` of `data_dir` started (Linux)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    marker = f"{STACK_ENV}={data_dir}".encode()
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            if _marked(pid, marker) and _alive(pid):
                found.append(Leftover(pid, _command(pid)))
    return sorted(found, key=lambda p: p.pid)


def stop_leftovers(procs: list[Leftover], data_dir: Path, *, own_exit: float = 10.0,
                   term: float = 10.0) -> list[Leftover]:
    """Stop what a killed `chronos up` left running; returns the processes that would not die.

    They were sent their parent-death signal already, so they get `own_exit` seconds to finish
    stopping by themselves, then SIGTERM, then after `term` seconds SIGKILL. Each is checked to
    still be of this stack right before a signal, so a reused pid is never hit.
    """
    marker = f"{STACK_ENV}={data_dir}".encode()

    def remaining() -> list[Leftover]:
        return [p for p in procs if _alive(p.pid) and _marked(p.pid, marker)]

    def wait(seconds: float) -> list[Leftover]:
        end = time.monotonic() + seconds
        left = remaining()
        while left and time.monotonic() < end:
            time.sleep(0.1)
            left = remaining()
        return left

    left = wait(own_exit)
    for sig, grace in ((signal.SIGTERM, term), (signal.SIGKILL, 5.0)):
        if not left:
            break
        for p in left:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError as exc:
                log.warning("cannot signal %s: %s", p, exc)
        left = wait(grace)
    return left
