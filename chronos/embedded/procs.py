"""What both embedded servers share: a child process in its own process group, its log file, its port.

A server runs in its own session (process group), so a Ctrl-C in a terminal reaches only the
parent, which then stops it explicitly. `kill()` SIGKILLs the whole process group. With
`die_with_parent` (a signal) a server gets that signal when the thread that started it ends, so
a killed parent leaves nothing running (Linux). A port chosen automatically is kept across
restarts of the same object, so clients' URLs stay valid.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any, NoReturn

from chronos.errors import EXIT_EMBEDDED, ChronosError
from chronos.runtime.orphans import child_dies_with_us

log = logging.getLogger("chronos.embedded")

HOST = "127.0.0.1"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TAIL_LINES = 12


class EmbeddedError(ChronosError, RuntimeError):
    """An embedded service could not be started (or was misused)."""

    exit_code = EXIT_EMBEDDED


class RetryStart(Exception):
    """This start attempt failed for a transient reason; try again."""


# ---------------------------------------------------------------------------------------------
# ports


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if a server could not bind host:port right now.

    Binds with SO_REUSEADDR like the servers do, so a port with only TIME_WAIT leftovers counts
    as free while a listener (on 127.0.0.1, 0.0.0.0 or ::) counts as in use.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def tcp_accepts(port: int) -> bool:
    """True if something accepts a TCP connection on 127.0.0.1:port."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# processes


def pid_alive(pid: int) -> bool:
    """True while a process `pid` exists (a zombie included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def proc_stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, ...]."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()  # comm may contain spaces and parentheses


def _alive_not_zombie(pid: int) -> bool:
    st = proc_stat(pid)
    if st is None:
        return pid_alive(pid) if not Path("/proc").is_dir() else False
    return st[0] not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Pids of all descendants of `pid` (Linux /proc; empty elsewhere). PostgreSQL backends
    call setsid(), so they are not in the postmaster's process group."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            st = proc_stat(entry.name)
            if st is not None and len(st) > 1:
                children.setdefault(int(st[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def group_alive(pgid: int) -> bool:
    """True while a non-zombie process of process group `pgid` exists."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if entry.name.isdigit():
            st = proc_stat(entry.name)
            if st is not None and len(st) >= 3 and st[2] == str(pgid) and st[0] not in "ZX":
                return True
    return False


# ---------------------------------------------------------------------------------------------
# logs


class LogFile:
    """A log file the child writes to (inherited fd); remembers where this run started.

    Without a path, each `open()` makes a temporary file that `close()` removes.
    """

    def __init__(self, path: Path | None, *, temp_prefix: str = "chronos-"):
        self.path = path
        self.temporary = path is None
        self.temp_prefix = temp_prefix
        self.fh: IO[bytes] | None = None
        self.offset = 0

    def open(self) -> IO[bytes]:
        if self.temporary:
            fd, name = tempfile.mkstemp(prefix=self.temp_prefix, suffix=".log")
            os.close(fd)
            self.path = Path(name)
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "ab", buffering=0)
        self.offset = self.fh.seek(0, os.SEEK_END)
        return self.fh

    def mark(self) -> IO[bytes]:
        """Start a new run in the open file: its tail begins here. Returns the file to hand the child."""
        assert self.fh is not None  # opened by start()
        self.offset = self.fh.seek(0, os.SEEK_END)
        return self.fh

    def write(self, text: str) -> None:
        if self.fh is not None:
            self.fh.write(text.encode("utf-8", "replace"))

    def tail(self, n: int = TAIL_LINES) -> list[str]:
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        if len(data) > 64 * 1024:
            data = data[-64 * 1024:]
        text = _ANSI.sub("", data.decode("utf-8", "replace"))
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[-n:]

    def matching(self, pattern: str, n: int = 3) -> str:
        """The last `n` lines of this run matching `pattern` (regex), else the plain tail."""
        rx = re.compile(pattern)
        lines = [ln for ln in self.tail(200) if rx.search(ln)][-n:]
        if not lines:
            return self.tail_text(n)
        return f"log ({self.path}): " + " | ".join(lines)

    def tail_text(self, n: int = TAIL_LINES) -> str:
        lines = self.tail(n)
        if not lines:
            return f"the log ({self.path}) is empty"
        return f"last log lines ({self.path}): " + " | ".join(lines)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if self.temporary and self.path is not None:
            try:
                self.path.unlink()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# the server process


class ServerProcess:
    """A server child that leads its own process group and listens on one local port.

    `start()` is one template for both servers: check the port, `_prepare()` what the start needs,
    then `_start_once()` until it is ready, retrying while it raises `RetryStart`.
    """

    name = "process"            # in log lines: "PostgreSQL", "broker"
    called = "the process"      # in sentences: "PostgreSQL", "the broker"
    attempts = 5                # start attempts, and the pause between two
    retry_pause = 0.0
    stop_timeout = 10.0

    def __init__(self, port: int | None, log_path: Path | None, die_with_parent: int | None = None,
                 *, temp_prefix: str = "chronos-") -> None:
        self._proc: subprocess.Popen | None = None
        self._preexec = child_dies_with_us(die_with_parent) if die_with_parent else None
        self._auto_port = port is None
        self._port = free_port() if port is None else int(port)
        self.log_path = Path(log_path).expanduser().absolute() if log_path is not None else None
        self._log = LogFile(self.log_path, temp_prefix=temp_prefix)

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """How the process ended (negative: the signal that killed it), None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it answers. Raises EmbeddedError (with the log tail)
        on failure."""
        if self.running:
            log.debug("%s already running (pid %s)", self.name, self.pid)
            return
        if self._proc is not None:  # it died on its own: start again on the same port
            self._cleanup()
        t0 = time.monotonic()
        deadline = t0 + timeout
        if not self._auto_port and port_in_use(self._port):
            raise self._port_error()
        try:
            self._log.open()
            how = self._prepare(timeout)
            for attempt in range(1, self.attempts + 1):
                try:
                    self._start_once(how, deadline)
                    break
                except RetryStart as e:
                    if attempt == self.attempts or time.monotonic() >= deadline:
                        raise EmbeddedError(f"{self.called} could not start: {e}; "
                                            f"{self._log.tail_text()}") from None
                    log.info("%s start attempt %s failed (%s); retrying", self.name, attempt, e)
                    time.sleep(self.retry_pause)
        except BaseException:
            if self._proc is not None:
                self._kill_group(self._proc, settle=1.0)
            self._cleanup()
            raise
        self._auto_port = False
        log.info("%s ready at %s in %.2fs (pid %s%s)", self.name, self.address, time.monotonic() - t0,
                 self.pid, self._ready_detail())

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server with SIGINT (PostgreSQL: a fast shutdown; the broker: at once, while
        SIGTERM would wait for every client to disconnect); SIGKILL if it does not stop in time."""
        if self._proc is None:
            self._cleanup()
            return
        log.info("stopping %s (pid %s)", self.called, self._proc.pid)
        self._stop_with(signal.SIGINT, self.stop_timeout if timeout is None else timeout)

    def note(self, line: str) -> None:
        """Write a line of the parent's own into the server's log (what happened to the server),
        while the log is open."""
        self._log.write(f"chronos up: {line}\n")

    def kill(self) -> None:
        """SIGKILL the process group (for fault tests) and reap the leader."""
        proc = self._proc
        if proc is None:
            return
        log.info("killing %s (pid %s)", self.name, proc.pid)
        self._kill_group(proc)
        self._cleanup()

    # -- what each server says ----------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{HOST}:{self._port}"

    def _ready_detail(self) -> str:
        return ""

    def _prepare(self, timeout: float) -> Any:
        """Everything before the first attempt (the log is open); returns what `_start_once` needs."""
        raise NotImplementedError

    def _start_once(self, how: Any, deadline: float) -> None:
        raise NotImplementedError

    # -- shared steps -------------------------------------------------------------------------

    def _port_error(self) -> EmbeddedError:
        return EmbeddedError(
            f"port {self._port} is already in use on 127.0.0.1 (another {self.name} or "
            f"program is listening there); stop it or choose another port for the "
            f"embedded {self.name}")

    def _take_port(self) -> None:
        """Before a start attempt: the port must be free; an automatic one is replaced if taken."""
        if port_in_use(self._port):
            if not self._auto_port:
                raise self._port_error()
            self._port = free_port()

    def _port_taken(self, log_pattern: str, lines: int) -> NoReturn:
        """The server said its port is taken: retry on another one, or fail if the port was chosen."""
        if self._auto_port:
            self._port = free_port()
            raise RetryStart("its port was taken")
        raise EmbeddedError(f"port {self._port} is already in use on 127.0.0.1 ({self.called} "
                            f"could not bind it); {self._log.matching(log_pattern, lines)}")

    def _spawn(self, cmd: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen:
        """Start `cmd` as the leader of a new session, its output appended to the log."""
        out = self._log.mark()
        log.debug("starting %s", cmd)
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      env=env, cwd="/", start_new_session=True, close_fds=True,
                                      preexec_fn=self._preexec, **kwargs)
        return self._proc

    def _startup_exited(self, proc: subprocess.Popen, rc: int) -> NoReturn:
        """The server exited while starting: reap what is left of it, then retry (`_why_exited`
        raises RetryStart) or fail with its log's tail."""
        self._kill_group(proc, settle=1.0)
        self._proc = None
        self._why_exited(" ".join(self._log.tail(40)))
        raise EmbeddedError(f"{self.called} exited during startup with code {rc}; {self._log.tail_text()}")

    def _why_exited(self, log_text: str) -> None:
        """Raise RetryStart (or call `_port_taken`) if the log says why the server exited."""

    def _not_ready(self, proc: subprocess.Popen, what: str, settle: float = 2.0) -> EmbeddedError:
        """Kill a server that did not become ready by the deadline; the error to raise."""
        self._kill_group(proc, settle=settle)
        self._proc = None
        return EmbeddedError(f"{what}; {self._log.tail_text()}")

    def _kill_group(self, proc: subprocess.Popen, settle: float = 2.0) -> None:
        """SIGKILL the leader, its process group and all its descendants (like a crash of the
        whole server), reap the leader and wait (up to `settle` s) for the rest to die."""
        others = descendants(proc.pid) if proc.poll() is None else []
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:  # should not happen: we started it
            proc.kill()
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and (
                group_alive(proc.pid) or any(_alive_not_zombie(p) for p in others)):
            time.sleep(0.01)

    def _stop_with(self, sig: int, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is not None:
            log.warning("%s (pid %s) had already exited with code %s",
                        self.name, proc.pid, proc.returncode)
        else:
            t0 = time.monotonic()
            try:
                proc.send_signal(sig)
                proc.send_signal(signal.SIGCONT)  # in case it is paused
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
                log.info("%s (pid %s) stopped in %.2fs", self.name, proc.pid,
                         time.monotonic() - t0)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %s) did not stop within %ss; killing it",
                            self.name, proc.pid, timeout)
                self._kill_group(proc)
        # the leader is gone; make sure nothing of its group survives it
        if group_alive(proc.pid):
            log.warning("%s left processes behind in group %s; killing them", self.name,
                        proc.pid)
            self._kill_group(proc)
        self._cleanup()

    def _cleanup(self) -> None:
        self._proc = None
        self._log.close()
