"""The system under test, for the benchmarks and the tests alike: `chronos up` as a subprocess.

`ChronosUp` runs `chronos up` in a working directory (its own embedded PostgreSQL and broker, under
`.chronos` there), waits for its ready file, talks to its supervisord (through `chronos up`'s own
client, chronos.up.supervisor), and stops it with SIGTERM like a user's Ctrl-C. The e2e, fault and
console tests and every benchmark that needs a stack use it.
For a peer target (`--target pgqueuer`, `--target graphile`) an embedded PostgreSQL with the same
settings as `chronos up`'s (durable: fsync on) is started instead (`OwnPostgres`); a stack somebody
else runs is named by its ready file (`External`). `run_on` is a benchmark's start-run-stop.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

import orjson

from chronos.up.supervisor import Supervisor

CHRONOS = [sys.executable, "-m", "chronos"]
T = TypeVar("T")


class StackFailed(RuntimeError):
    pass


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body) of a GET, an error status included; (0, b"") when nothing answers in time (a
    process's /healthz or /metrics, a Patroni member's REST API)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError):
        return 0, b""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without CHRONOS_* settings (so a stack is configured by its arguments only), plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")}, **extra}


def layout_args(consumers: int, firers: int, detectors: int) -> list[str]:
    """`chronos up`'s arguments for this many processes per role."""
    return ["--consumers", str(consumers), "--firers", str(firers), "--detectors", str(detectors)]


def supervisor(info: dict) -> Supervisor:
    """The supervisord of the stack whose ready file says `info`."""
    return Supervisor(info["supervisor_socket"])


class ChronosUp:
    """`chronos up ARGS` run in `workdir`, or in a temporary directory of its own (removed at `stop`).

    `launch` only starts it (for a start that is meant to fail); `start` also waits for it to be
    ready. Supervisor's programs are named `consumer_00`, `firer_01`, ...
    """

    starting = "starting the stack ..."

    def __init__(self, *args: str, workdir: Path | None = None, env: dict[str, str] | None = None):
        self.owned = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="chronos-stack-")) if workdir is None else Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ready_file = self.workdir / "ready.json"
        self.args = ["up", "--ready-file", str(self.ready_file), *args]
        self.env = clean_env(**(env or {}))
        self.out = self.workdir / "up.out"
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}

    def launch(self) -> "ChronosUp":
        """Start `chronos up` without waiting for it; its output goes to a file of this start's own."""
        self.out = self.workdir / f"up-{time.monotonic_ns()}.out"
        self.proc = subprocess.Popen(CHRONOS + self.args, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=open(self.out, "wb"), stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 120.0) -> dict:
        """The ready file's contents once this `chronos up` wrote it (not one a killed one left behind)."""
        assert self.proc is not None, "launch() first"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            info = orjson.loads(self.ready_file.read_bytes()) if self.ready_file.exists() else {}
            if info.get("pid") == self.proc.pid:
                self.info = info
                return info
            if self.proc.poll() is not None:
                raise StackFailed(f"chronos up exited with code {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.1)
        raise StackFailed(f"chronos up was not ready within {timeout:.0f}s:\n{self.tail()}")

    def start(self, timeout: float = 120.0) -> dict:
        """Launch `chronos up` and wait until it is ready: its ready file's contents."""
        return self.launch().wait_ready(timeout)

    def output(self) -> str:
        """What this start of `chronos up` printed so far."""
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().strip().splitlines()[-lines:]) or "(no output)"

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackFailed(f"chronos up exited during the run (code {self.proc.returncode}):\n{self.tail()}")

    def halt(self, timeout: float = 90.0) -> bool:
        """SIGTERM `chronos up` and wait for it (SIGKILL after `timeout`), its directory left as it is, for
        the next start or a look at its logs: whether it stopped by itself."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            print(f"chronos up did not stop within {timeout:.0f}s; killing it (logs in {self.workdir})", flush=True)
            self.kill()
            return False

    def stop(self, timeout: float = 90.0, keep: bool = False) -> int | None:
        """SIGTERM `chronos up` and wait for it (SIGKILL after `timeout`): its exit code. A temporary
        directory of its own is removed unless `keep` (e.g. to read its logs) or it had to be killed."""
        if self.proc is None:
            return None
        if not self.halt(timeout):
            return self.proc.returncode
        if self.owned and keep:
            print(f"the stack's data and logs are kept in {self.workdir}", flush=True)
        elif self.owned:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL `chronos up` itself: it gets no chance to stop anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> dict:
        """A fresh stack in place of this one (of its own directory: new data, broker and PostgreSQL)."""
        assert self.owned, "only a stack in a temporary directory of its own starts afresh"
        self.stop()
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.start()

    # -- its supervisord's programs

    @property
    def log_dir(self) -> Path:
        return Path(self.info["log_dir"])

    def supervisor(self) -> Supervisor:
        return supervisor(self.info)

    def programs(self) -> dict[str, dict]:
        """Supervisor's process info by name (`consumer_00`, `firer_01`, ...)."""
        return {p["name"]: p for p in self.supervisor().programs()}

    def program_pids(self) -> list[int]:
        return [p["pid"] for p in self.programs().values() if p["pid"]]

    def running(self, name: str) -> int | None:
        info = self.programs()[name]
        return info["pid"] if info["statename"] == "RUNNING" else None

    def wait_running(self, name: str, not_pid: int | None = None, timeout: float = 30.0) -> tuple[int, float]:
        """Wait until program `name` is RUNNING (with a pid other than `not_pid`) and has logged its
        start (supervisord calls it RUNNING as soon as it is spawned): (pid, when)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            info = self.programs()[name]
            if info["statename"] == "RUNNING" and info["pid"] != not_pid \
                    and f", pid {info['pid']}," in self.log(name):
                return info["pid"], time.time()
            if info["statename"] == "FATAL":
                raise AssertionError(f"{name} is FATAL: {self.log(name)[-2000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{name} not RUNNING again within {timeout}s: {self.programs()[name]}")

    def all_running(self, except_names: tuple[str, ...] = ()) -> dict[str, str]:
        """Names of programs not RUNNING (empty when all are), besides the ones expected to be stopped."""
        return {n: p["statename"] for n, p in self.programs().items()
                if n not in except_names and p["statename"] != "RUNNING"}

    def kill_program(self, name: str) -> tuple[int, float]:
        """SIGKILL program `name` (it must be RUNNING): (pid, when)."""
        pid = self.running(name)
        assert pid, f"{name} is not RUNNING: {self.programs()[name]}"
        os.kill(pid, signal.SIGKILL)
        return pid, time.time()

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def node_of(self, name: str, pid: int) -> str:
        """The node id process `pid` of program `name` logged at start."""
        end = time.monotonic() + 10
        while time.monotonic() < end:
            match = re.search(rf"starting: node ([0-9a-f-]{{36}}), pid {pid},", self.log(name))
            if match:
                return match.group(1)
            time.sleep(0.05)
        raise AssertionError(f"{name} pid {pid} logged no node id:\n{self.log(name)[-2000:]}")


class OwnPostgres:
    """An embedded PostgreSQL for a peer target without a ready file (same settings as `chronos up`)."""

    starting = "starting PostgreSQL ..."

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="peer-bench-"))
        self.server = None

    def start(self) -> dict:
        from chronos.embedded.postgres import EmbeddedPostgres
        self.server = EmbeddedPostgres(self.dir / "pgdata", log_path=self.dir / "postgres.log")
        self.server.start()
        return {"database_url": self.server.url, "postgres_pid": self.server.pid, "data_dir": str(self.dir)}

    def check_alive(self) -> None:
        if self.server is not None and not self.server.running:
            raise StackFailed(f"the embedded PostgreSQL stopped during the run; see {self.dir / 'postgres.log'}")

    def stop(self, keep: bool = False) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
            if keep:
                print(f"PostgreSQL's data and log are kept in {self.dir}", flush=True)
            else:
                shutil.rmtree(self.dir, ignore_errors=True)


class ChronosOnPostgres:
    """`chronos up ARGS` on a PostgreSQL of its own (`OwnPostgres`, `--database-url`) that outlives it:
    `renew` stops Chronos and its memory-only broker and starts them again, while PostgreSQL runs on with
    all it carried (tables, bloat, statistics, an autovacuum under way), as a production server does.
    Ready information: the stack's, with that PostgreSQL's pid (its CPU counted as the stack's)."""

    starting = "starting PostgreSQL, then the stack on it ..."

    def __init__(self, *args: str):
        self.args = args
        self.postgres = OwnPostgres()
        self.chronos: ChronosUp | None = None
        self.postgres_pid: int | None = None

    def start(self) -> dict:
        pg = self.postgres.start()
        self.postgres_pid = pg["postgres_pid"]
        self.chronos = ChronosUp("--database-url", pg["database_url"], *self.args)
        return self.ready(self.chronos.start())

    def renew(self) -> dict:
        """Chronos and the broker stopped and started again; PostgreSQL untouched."""
        assert self.chronos is not None, "start() first"
        self.chronos.halt()  # its directory is the next start's
        return self.ready(self.chronos.start())

    def ready(self, info: dict) -> dict:
        return {**info, "postgres_pid": self.postgres_pid}

    def check_alive(self) -> None:
        self.postgres.check_alive()
        if self.chronos is not None:
            self.chronos.check_alive()

    def stop(self, keep: bool = False) -> None:
        try:
            if self.chronos is not None:
                self.chronos.stop(keep=keep)
        finally:
            self.postgres.stop(keep=keep)


class External:
    """A stack somebody else runs (`--ready-file`): never started or stopped here."""

    def __init__(self, ready_file: Path):
        self.ready_file = ready_file
        self.starting = f"using the stack of {ready_file}"

    def start(self) -> dict:
        if not self.ready_file.exists():
            raise StackFailed(f"no ready file at {self.ready_file}: is `chronos up --ready-file` running?")
        return orjson.loads(self.ready_file.read_bytes())

    def check_alive(self) -> None:
        if not self.ready_file.exists():
            raise StackFailed(f"the ready file {self.ready_file} disappeared: the stack stopped")

    def stop(self, keep: bool = False) -> None:
        pass


def run_on(stack: ChronosUp | ChronosOnPostgres | OwnPostgres | External, body: Callable[[dict], T]) -> tuple[int, T | None]:
    """A benchmark's run: start `stack`, call `body` with its ready information, stop the stack (its
    directory is kept for a look when the run did not finish). (0, what `body` returned), or (3, None)
    when the stack failed, (130, None) when interrupted: the exit codes of every benchmark. A SIGTERM
    interrupts it as Ctrl-C does, so a benchmark stopped by a script stops its stack and its load too
    (a second SIGTERM while it stops them is ignored)."""
    failed = True

    def terminated(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        print(stack.starting, flush=True)
        result = body(stack.start())
        failed = False
        return 0, result
    except StackFailed as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr, flush=True)
        return 3, None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130, None
    finally:
        print("stopping ...", flush=True)
        try:
            stack.stop(keep=failed)
        finally:
            signal.signal(signal.SIGTERM, previous)

