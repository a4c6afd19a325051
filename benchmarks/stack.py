"""The system under test: a running stack named by its ready file, or one the harness starts.

`chronos up` is started as a subprocess in a temporary directory (its own embedded PostgreSQL
and broker), waited for through its ready file, and stopped with SIGTERM like a user's Ctrl-C.
For a peer target (`--target pgqueuer`, `--target graphile`) without a ready file, an embedded
PostgreSQL with the same settings as `chronos up`'s (durable: fsync on) is started instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson


class StackFailed(RuntimeError):
    pass


def _clean_env() -> dict[str, str]:
    """The environment without CHRONOS_* settings, so the stack is configured by its arguments only."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")}


class OwnStack:
    """`chronos up --consumers C --firers F --detectors D [extra...]` in a temporary directory."""

    def __init__(self, counts: dict[str, int], extra: list[str], keep_dir: Path | None = None):
        self.counts, self.extra = counts, extra
        self.dir = Path(tempfile.mkdtemp(prefix="chronos-bench-", dir=keep_dir))
        self.ready_file = self.dir / "ready.json"
        self.log = self.dir / "up.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "chronos", "up", "--data-dir", str(self.dir / "data"),
                "--ready-file", str(self.ready_file),
                "--consumers", str(self.counts["consumer"]), "--firers", str(self.counts["firer"]),
                "--detectors", str(self.counts["detector"]), *self.extra]

    def start(self, timeout: float = 120.0) -> dict:
        self.proc = subprocess.Popen(self.command(), cwd=self.dir, env=_clean_env(), stdin=subprocess.DEVNULL,
                                     stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.ready_file.exists():
                return orjson.loads(self.ready_file.read_bytes())
            if self.proc.poll() is not None:
                raise StackFailed(f"chronos up exited with code {self.proc.returncode}: {self.tail()}")
            time.sleep(0.1)
        raise StackFailed(f"chronos up was not ready within {timeout:.0f}s: {self.tail()}")

    def tail(self, lines: int = 8) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no output)"

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackFailed(f"chronos up exited during the run (code {self.proc.returncode}): {self.tail()}")

    def stop(self, timeout: float = 90.0, keep: bool = False) -> None:
        """SIGTERM `chronos up`; its directory is removed unless `keep` (e.g. to read its logs)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"chronos up did not stop within {timeout:.0f}s; killing it (logs in {self.dir})", flush=True)
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                return
        self.proc = None
        if keep:
            print(f"the stack's data and logs are kept in {self.dir}", flush=True)
        else:
            _remove(self.dir)


    def restart(self) -> dict:
        """A fresh stack in place of this one: new data directory, broker and PostgreSQL."""
        self.stop()
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.start()


class OwnPostgres:
    """An embedded PostgreSQL for a peer target without a ready file (same settings as `chronos up`)."""

    def __init__(self, keep_dir: Path | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="peer-bench-", dir=keep_dir))
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
                _remove(self.dir)


class External:
    """A stack somebody else runs (`--ready-file`): never started or stopped here."""

    def __init__(self, ready_file: Path):
        self.ready_file = ready_file

    def start(self) -> dict:
        if not self.ready_file.exists():
            raise StackFailed(f"no ready file at {self.ready_file}: is `chronos up --ready-file` running?")
        return orjson.loads(self.ready_file.read_bytes())

    def check_alive(self) -> None:
        if not self.ready_file.exists():
            raise StackFailed(f"the ready file {self.ready_file} disappeared: the stack stopped")

    def stop(self, keep: bool = False) -> None:
        pass


def _remove(directory: Path) -> None:
    """Delete a stopped stack's temporary directory (its database holds nothing worth keeping)."""
    shutil.rmtree(directory, ignore_errors=True)


def database_url_for(url: str, name: str) -> str:
    """The URL of database `name` on the same server as `url`."""
    base, _, rest = url.rpartition("/")
    query = rest.partition("?")[2]
    return f"{base}/{name}" + (f"?{query}" if query else "")
