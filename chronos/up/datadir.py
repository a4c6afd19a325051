"""The data directory one `chronos up` owns: its lock, its logs, its run directory and supervisord's
socket there, and what an earlier `chronos up` of it that was killed left running."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from chronos.errors import StackError
from chronos.runtime import orphans

SOCKET_PATH_MAX = 100  # bytes: a Unix socket's path must fit sun_path (108 on Linux, 104 on BSDs)


def short_run_dir(run_dir: Path) -> Path:
    """Where supervisord may put its socket: the run directory, or, when the socket's path there
    would be too long for a Unix socket (a deep data directory), a short link to it in /tmp named
    after it. supervisord cannot bind a longer path at all, and says only "AF_UNIX path too long"."""
    if len(os.fsencode(run_dir / "supervisor.sock")) <= SOCKET_PATH_MAX:
        return run_dir
    link = Path("/tmp") / f"chronos-run-{hashlib.sha256(os.fsencode(run_dir.resolve())).hexdigest()[:16]}"
    if link.is_symlink() or link.exists():
        link.unlink()  # a link a killed `chronos up` of this data directory left
    link.symlink_to(run_dir.resolve(), target_is_directory=True)
    return link


class DataDir:
    """`path` with `logs/` and `run/` (the lock `up.lock`, the broker's stats file, supervisord's socket)."""

    def __init__(self, path: Path):
        self.path = path
        self.run = path / "run"
        self.logs = path / "logs"
        self.supervisor_dir = self.run  # the run directory, by a short link when its path is too long
        self.lock = orphans.StackLock(self.run / "up.lock")

    @property
    def socket(self) -> Path:
        """supervisord's socket."""
        return self.supervisor_dir / "supervisor.sock"

    def claim(self, ready_file: Path | None) -> None:
        """Own the data directory: refuse if a live `chronos up` has it, stop what a dead one left, and
        remove the ready file it left (nothing is ready yet).

        From here on every process started carries the data directory in its environment.
        """
        for d in (self.path, self.run, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        if not self.lock.acquire():
            raise StackError(f"the data directory {self.path} is in use by another chronos up "
                             f"(pid {self.lock.owner()}); stop it first, or give another --data-dir")
        os.environ[orphans.STACK_ENV] = str(self.path)
        self.supervisor_dir = short_run_dir(self.run)
        left = orphans.leftovers(self.path)
        if left:
            print(f"an earlier chronos up of {self.path} was killed and left {len(left)} processes "
                  f"running: {', '.join(map(str, left))}; stopping them", flush=True)
            stuck = orphans.stop_leftovers(left, self.path)
            if stuck:
                raise StackError(f"processes left behind by an earlier chronos up of {self.path} do not "
                                 f"stop: {', '.join(map(str, stuck))}; stop them yourself")
            print("stopped what the earlier chronos up left behind", flush=True)
        if ready_file is not None and ready_file.exists():
            ready_file.unlink()

    @property
    def held(self) -> bool:
        """Whether this `chronos up` owns the data directory (it claimed it and has not released it)."""
        return self.lock.held

    def release(self) -> None:
        """Give the data directory up (its short link to the run directory too)."""
        if self.supervisor_dir != self.run:
            self.supervisor_dir.unlink(missing_ok=True)
        self.lock.release()
