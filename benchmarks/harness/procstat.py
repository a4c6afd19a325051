"""CPU time and memory per process (Linux /proc), so a run shows which process the time and the memory
go to. The /proc readers are `chronos up`'s own (chronos.embedded): one reading of a process for the
product and the benchmarks."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from chronos.embedded.procs import descendants, proc_stat
from chronos.adapters.kafka.brokerstats import rss_bytes

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """CPU time process `pid` used so far (user and system), or None when it is gone."""
    st = proc_stat(pid)
    return None if st is None else _cpu(st)


def _cpu(st: list[str]) -> float:
    """CPU seconds in the fields of a /proc/PID/stat (`proc_stat`): utime and stime."""
    return (int(st[11]) + int(st[12])) / _TICK


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of process `pid` (MB, one decimal), or None when it is not there."""
    rss = rss_bytes(pid) if pid else None
    return None if rss is None else round(rss / 2**20, 1)


class CpuMeter:
    """CPU seconds used by named groups of processes between `start()` and `stop()`.

    A group is a pid plus (optionally) its descendants, e.g. PostgreSQL with its backends.
    Processes that start or end inside the window count only for the part that was seen.
    """

    def __init__(self, groups: dict[str, tuple[int, bool]]):
        self.groups = {name: g for name, g in groups.items() if g[0]}
        self.before: dict[str, dict[int, float]] = {}
        self.latest: dict[str, dict[int, float]] = {}
        self.t0 = 0.0

    def _sample(self) -> dict[str, dict[int, float]]:
        out = {}
        for name, (pid, with_children) in self.groups.items():
            pids = [pid] + (descendants(pid) if with_children else [])
            out[name] = {p: c for p in pids if (c := cpu_seconds(p)) is not None}
        return out

    def start(self, now: float) -> None:
        self.t0 = now
        self.before = self._sample()
        self.latest = {name: dict(per_pid) for name, per_pid in self.before.items()}

    def sample(self) -> None:
        """Remember the latest figures, so a process that exits before `stop()` still counts."""
        for name, per_pid in self._sample().items():
            self.latest.setdefault(name, {}).update(per_pid)

    def stop(self, now: float) -> dict:
        self.sample()
        wall = max(now - self.t0, 1e-9)
        result = {}
        for name, per_pid in self.latest.items():
            used = sum(c - self.before.get(name, {}).get(p, 0.0) for p, c in per_pid.items())
            result[name] = {"cpu_s": round(used, 2), "cores": round(used / wall, 3)}
        return result


def kind_of(cmdline: str, parent_cmdline: str = "") -> str:
    """What a process is, from its command line (NUL-separated arguments joined by spaces) and its parent's:
    a Chronos role or command (`chronos firer`, `chronos cells`), a PostgreSQL process by what it does and
    whose it is (`postgres pgdata-2 autovacuum`, `... backend`, `... server` for the others), the broker,
    or the program's name."""
    words = cmdline.split()
    if not words:
        return "?"
    if words[0].startswith("postgres:"):
        title = cmdline[len("postgres:"):].strip()
        data = re.search(r"-D (\S+)", parent_cmdline)
        whose = Path(data.group(1)).name if data else "?"
        if title.startswith("autovacuum worker"):
            return f"postgres {whose} autovacuum"
        if title.startswith(("walwriter", "checkpointer", "background writer", "autovacuum launcher",
                             "logical replication", "archiver", "walsender", "startup")):
            return f"postgres {whose} server"
        return f"postgres {whose} backend"
    if Path(words[0]).name == "postgres":
        data = re.search(r"-D (\S+)", cmdline)
        return f"postgres {Path(data.group(1)).name if data else '?'} server"
    if "-m" in words:
        module, *rest = words[words.index("-m") + 1:] or [""]
        if module == "chronos":
            command = [w for w in rest if not w.startswith("-")]
            return f"chronos {command[0]}" if command else "chronos"
        return module
    if " broker " in f" {cmdline} " or "tansu" in words[0]:
        return "broker"
    if "multiprocessing" in cmdline:
        return "python worker"
    return Path(words[0]).name


class MachineCpu(threading.Thread):
    """The machine's CPU by kind of process (`kind_of`), sampled every `every` s from /proc: every process,
    whoever started it, so that the load a run puts on the machine shows where it went, second by second."""

    def __init__(self, every: float = 1.0):
        super().__init__(name="machine-cpu", daemon=True)
        self.every = every
        self.stopping = threading.Event()
        self.samples: list[tuple[float, dict[str, float]]] = []  # (when, CPU seconds by kind since the last)
        self._seen: dict[int, tuple[float, str]] = {}

    def _read(self) -> dict[int, tuple[float, str]]:
        stats: dict[int, tuple[float, int]] = {}
        cmds: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            st = proc_stat(entry)
            if st is None or len(st) < 13:
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            pid = int(entry)
            stats[pid] = (_cpu(st), int(st[1]))
            cmds[pid] = cmd.strip()
        return {pid: (cpu, kind_of(cmds[pid], cmds.get(ppid, ""))) for pid, (cpu, ppid) in stats.items()
                if cmds[pid]}

    def run(self) -> None:
        self._seen = self._read()
        while not self.stopping.wait(self.every):
            now = self._read()
            used: dict[str, float] = {}
            for pid, (cpu, kind) in now.items():
                before = self._seen.get(pid)
                delta = cpu - before[0] if before is not None else 0.0  # a process born meanwhile: from now on
                if delta > 0:
                    used[kind] = used.get(kind, 0.0) + delta
            self._seen = now
            self.samples.append((time.time(), used))

    def by_10s(self, zero: float, top: int = 8) -> list[dict[str, Any]]:
        """Per 10 s from `zero`: the cores each kind of process used (the `top` most), and the whole machine's."""
        groups: dict[int, list[tuple[float, dict[str, float]]]] = {}
        for at, used in self.samples:
            groups.setdefault(int((at - zero) // 10), []).append((at, used))
        rows = []
        for b, items in sorted(groups.items()):
            total: dict[str, float] = {}
            for _, used in items:
                for k, v in used.items():
                    total[k] = total.get(k, 0.0) + v
            wall = max(len(items) * self.every, 1e-9)
            ranked = sorted(total.items(), key=lambda kv: -kv[1])[:top]
            rows.append({"from_s": b * 10, "cores": round(sum(total.values()) / wall, 2),
                         "by_kind": {k: round(v / wall, 2) for k, v in ranked}})
        return rows
