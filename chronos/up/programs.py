"""The consumer, firer and detector programs that supervisord runs for `chronos up`, followed through
its XML-RPC interface: started once each has run a while, stopped for good, restarted by supervisord.

A crashed program is restarted by supervisord (and waits longer after each crash in a row:
chronos.runtime.process); one that exited with a configuration or schema error is not, and neither
is one that could not be spawned (FATAL). The decisions take supervisord's process info as it
answered, so they test without a supervisord.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from chronos.errors import EXIT_CONFIG, EXIT_SCHEMA, StackError
from chronos.up.supervisor import Supervisor, SupervisorError

log = logging.getLogger("chronos.up")

# a program is taken as started once it has run this long (it checked its settings and the schema)
PROGRAM_SETTLE_S = 2.0
# exit codes of a program that restarting cannot help: it is not restarted (supervisord.conf)
FINAL_EXITS = {EXIT_CONFIG: "a configuration error", EXIT_SCHEMA: "the database is not migrated"}


def live_counts(counts: dict[str, int]) -> dict[str, int]:
    """The roles that run (not those asked for 0), with their number of processes."""
    return {role: n for role, n in counts.items() if n > 0}


class Programs:
    """The programs of `counts` processes per role (a role asked for 0 is stopped), under `supervisor`;
    `pids` are the last pids seen of each, by program name. Their logs are in `log_dir`."""

    def __init__(self, supervisor: Supervisor, counts: dict[str, int], log_dir: Path):
        self.supervisor, self.counts, self.log_dir = supervisor, counts, log_dir
        self.pids: dict[str, int] = {}

    def wait_started(self, check: Callable[[], None], timeout: float = 60.0,
                     sleep: Callable[[float], None] = time.sleep) -> None:
        """Return once every program of a role that runs has run PROGRAM_SETTLE_S; `check` first at every
        look (it raises to give up). A program that failed, or `timeout` passing, is a StackError."""
        deadline = time.monotonic() + timeout
        while True:
            check()
            try:
                infos = self.supervisor.programs()
            except SupervisorError:
                infos = None
            if infos is not None and self.started(infos):
                return
            if time.monotonic() > deadline:
                raise StackError("the programs did not all reach RUNNING within "
                                 f"{timeout:.0f}s; see {self.log_dir}")
            sleep(0.2)

    def started(self, infos: list[dict]) -> bool:
        """Whether every program wanted runs and has run PROGRAM_SETTLE_S (then their pids are kept); stops the
        roles asked for 0 (supervisord.conf starts one of each), and fails on a program that failed."""
        for group, count in self.counts.items():
            if count == 0:
                self.supervisor.stop_group(group)
        for info in infos:
            if info["statename"] == "FATAL" or (info["statename"] == "EXITED" and info["exitstatus"] != 0):
                tail = _tail(Path(info["stdout_logfile"]), 3)
                raise StackError(f"program {info['name']} failed ({info['statename']}, exit "
                                 f"{info['exitstatus']}): {tail}")
        wanted = [i for i in infos if self.counts.get(i["group"], 1) > 0]
        if wanted and all(i["statename"] == "RUNNING" and i["now"] - i["start"] >= PROGRAM_SETTLE_S for i in wanted):
            self.pids = {i["name"]: i["pid"] for i in wanted}
            return True
        return False

    def check(self, infos: list[dict]) -> None:
        """While running: a StackError on a program that stopped for good; a line when one was restarted."""
        for info in infos:
            name, state = info["name"], info["statename"]
            why = "it cannot be spawned" if state == "FATAL" else \
                FINAL_EXITS.get(info["exitstatus"]) if state == "EXITED" else None
            if why:
                tail = _tail(Path(info["stdout_logfile"]), 3)
                raise StackError(f"program {name} stopped for good ({state}, exit {info['exitstatus']}: "
                                 f"{why}): {tail}")
            old = self.pids.get(name)
            if state == "RUNNING" and old and info["pid"] != old:
                print(f"program {name} was restarted by supervisord (pid {old} -> "
                      f"{info['pid']}); see {info['stdout_logfile']}", flush=True)
            if info["pid"]:
                self.pids[name] = info["pid"]

    def stop_all(self) -> None:
        """Stop every program (gracefully, as supervisord.conf says) and wait until they stopped."""
        try:
            self.supervisor.stop_all()
        except SupervisorError as exc:
            log.warning("cannot stop the programs through supervisord: %s", exc)

    def start_all(self) -> None:
        """Start the programs of every role that runs (not those asked for 0) and note their new pids."""
        try:
            for group in live_counts(self.counts):
                self.supervisor.start_group(group)
            self.pids = {i["name"]: i["pid"] for i in self.supervisor.programs() if i["pid"]}
        except SupervisorError as exc:
            log.warning("cannot start the programs through supervisord: %s", exc)


def _tail(path: Path, lines: int) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"
