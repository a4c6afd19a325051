"""A session's server process run at a lower priority, where it runs on this host: what a command that works in
the background (`chronos cells move`) asks, so that the database work it causes waits, like its own, for the
processes the host's cores serve first.

PostgreSQL says which process serves the session and when it started; the process of that number on this host
is lowered only if it is a PostgreSQL process that started then (a server on another host, or in a container of
its own process numbers, has a process of that number here only by chance, and not one started that second).
Lowering another user's process takes root (or CAP_SYS_NICE): without it, nothing is changed."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import psycopg

from chronos.adapters.postgres.connection import one
from chronos.adapters.postgres.queries import QUERIES

log = logging.getLogger("chronos.store")

STARTED_WITHIN_S = 2.0  # PostgreSQL's start time of the backend and the kernel's agree this closely


def process_started(pid: int, proc: Path = Path("/proc")) -> tuple[str, float] | None:
    """The name and the start time (seconds since the epoch) of process `pid` on this host; None if there is none
    (or no /proc)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        boot = next(float(line.split()[1]) for line in (proc / "stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    # the 22nd field of /proc/PID/stat, counted with the pid and the name: clock ticks from boot to its start
    return name, boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def lower(conn: psycopg.Connection, nice: int, *, started: Callable[[int], tuple[str, float] | None] = process_started,
          setpriority: Callable[[int, int, int], None] = os.setpriority,
          getpriority: Callable[[int, int], int] = os.getpriority) -> bool:
    """The niceness of the process serving `conn` raised to `nice` (never lowered), if it is a PostgreSQL process
    of this host; whether it was."""
    pid, began = one(conn.execute(QUERIES["backend_started"]))
    here = started(int(pid))
    if here is None or here[0] != "postgres" or abs(here[1] - float(began)) > STARTED_WITHIN_S:
        log.debug("PostgreSQL's process %s is not on this host: its priority stays", pid)
        return False
    try:
        if getpriority(os.PRIO_PROCESS, int(pid)) < nice:
            setpriority(os.PRIO_PROCESS, int(pid), nice)
    except OSError as exc:  # another user's process, without the right to lower it
        log.debug("cannot lower the priority of PostgreSQL's process %s: %s", pid, exc)
        return False
    return True
