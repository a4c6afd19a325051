"""CPU time and memory per process (Linux /proc), so a run shows which process the time and the memory
go to. The /proc readers are `chronos up`'s own (chronos.embedded): one reading of a process for the
product and the benchmarks."""

from __future__ import annotations

import os

from chronos.embedded.procs import descendants, proc_stat
from chronos.adapters.kafka.brokerstats import rss_bytes

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """CPU time process `pid` used so far (user and system), or None when it is gone."""
    st = proc_stat(pid)
    if st is None:
        return None
    return (int(st[11]) + int(st[12])) / _TICK  # utime, stime


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
