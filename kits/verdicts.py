"""The verdict of a run under faults: what was lost, published early or twice (and whether a fault
explains each duplicate), how late, and when firing resumed after each fault. Used by the scenarios on
one stack (kits.faults) and on a fleet (kits.fleet.scenarios) alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kits.figures import percentiles
from kits.traffic import Load, Reader

TIMING_ADVANCE_S = 0.050   # chronos's default CHRONOS_TIMING_ADVANCE_MS
LATE_S = 1.0               # a delivery later than this after its due time counts as delayed by a fault


class Traffic(Protocol):
    """A run's load and reader (a scenario on one stack or on a fleet)."""

    load: Load
    reader: Reader


@dataclass
class Fault:
    """One injected fault: what, when it began and ended, and what was in flight when it began."""

    what: str
    start: float
    end: float | None = None
    back_running: float | None = None         # when supervisord had the program RUNNING again
    held: dict[str, float] = field(default_factory=dict)   # rows a killed firer held: id -> readied_at
    committed: dict[int, int] | None = None   # the consumer group's committed offsets at the fault
    node: str | None = None                   # node id of the killed process
    observed: bool = False                    # not injected: seen in the logs (explains what was sent in it)

    def ended(self) -> float:
        return self.end if self.end is not None else self.start


@dataclass
class Report:
    scenario: str
    sent: int
    delivered: int
    lost: list[str]
    early: list[tuple[str, float]]
    duplicates: int
    duplicated_ids: dict[str, int]
    unexplained: list[str]
    recovery_s: float
    max_lateness_s: float
    p99_lateness_s: float
    faults: list[Fault]
    lost_found_on_reread: list[str] = field(default_factory=list)  # the live reader missed them; on the topic after all
    session_losses: int = 0  # consumer group sessions that expired without an injected fault

    def row(self) -> dict:
        return {"scenario": self.scenario, "sent": self.sent, "delivered": self.delivered,
                "lost": len(self.lost), "early": len(self.early), "duplicates": self.duplicates,
                "unexplained_duplicates": len(self.unexplained), "recovery_s": round(self.recovery_s, 2),
                "max_lateness_s": round(self.max_lateness_s, 2), "p99_lateness_s": round(self.p99_lateness_s, 3),
                "faults": len(self.faults), "lost_found_on_reread": len(self.lost_found_on_reread),
                "session_losses": self.session_losses}

    def line(self) -> str:
        r = self.row()
        return (f"{r['scenario']:<28} sent={r['sent']:<6} delivered={r['delivered']:<6} lost={r['lost']:<3} "
                f"early={r['early']:<3} duplicates={r['duplicates']:<5} (unexplained {r['unexplained_duplicates']}) "
                f"recovery={r['recovery_s']:.1f}s max_lateness={r['max_lateness_s']:.1f}s faults={r['faults']} "
                f"session_losses={r['session_losses']}")


def analyse(scenario: str, load: Load, reader: Reader, faults: list[Fault], *, hold_s: float,
            window_explains: bool = False) -> Report:
    """The verdict of one run.

    A duplicate is explained when the message was in flight at a fault: held (claimed) by a
    firer that was killed, or at or past the consumer group's committed offset when a consumer
    died or left (and sent before the group settled again); for outages of a whole service
    (`window_explains`), when it was due between `hold_s` before the outage and its end; for a
    consumer group session that expired on its own (an `observed` fault, from the logs), when it
    was sent in the seconds before.
    Recovery of a fault: from its end until the last message it delayed was delivered and the
    program was RUNNING again.
    """
    sent = load.sent
    arrivals = reader.arrivals
    lost = sorted(m for m in sent if m not in arrivals)
    early = [(m, s.deadline - min(arrivals[m])) for m, s in sent.items()
             if m in arrivals and min(arrivals[m]) < s.deadline - TIMING_ADVANCE_S]
    dup_ids = {m: len(arrivals[m]) - 1 for m in sent if len(arrivals.get(m, ())) > 1}

    def explained(m: str) -> bool:
        s = sent[m]
        for f in faults:
            if f.observed:
                if f.start <= s.produced <= f.ended():
                    return True
                continue
            if m in f.held:
                return True
            if f.committed is not None and s.produced <= f.ended() + 10 and \
                    s.offset >= f.committed.get(s.partition, -1):
                return True
            if window_explains and f.start - hold_s - 1 <= s.due <= f.ended() + 1:
                return True
        return False

    unexplained = sorted(m for m in dup_ids if not explained(m))
    lateness = {m: min(arrivals[m]) - s.due for m, s in sent.items() if m in arrivals}
    # a fault is over when the messages due while it lasted (from a hold time before it began: rows
    # already claimed) that it delayed have arrived, and its program is RUNNING again; messages due
    # later are left out, so a later hiccup of the (shared) machine does not count
    injected = [f for f in faults if not f.observed]
    done = {id(f): max(f.ended(), f.back_running or 0.0) for f in injected}
    for m, s in sent.items():
        if m in arrivals and lateness[m] > LATE_S:
            candidates = [f for f in injected if f.start - hold_s - 1 <= s.due <= f.ended() + 1]
            if candidates:
                f = max(candidates, key=lambda f: f.start)
                done[id(f)] = max(done[id(f)], min(arrivals[m]))
    recovery = max((done[id(f)] - f.ended() for f in injected), default=0.0)
    figures = percentiles(list(lateness.values())) or {"max": 0.0, "p99": 0.0}
    return Report(scenario, len(sent), len(set(arrivals) & set(sent)), lost, early, sum(dup_ids.values()),
                  dup_ids, unexplained, recovery, figures["max"], figures["p99"], injected)


def session_losses(log_dir: Path, window: float = 10.0) -> list[Fault]:
    """Consumers whose group session expired on their own (the broker did not answer for longer than
    the session timeout): their last batch is read again, so what was sent shortly before may be
    published twice. Found in the consumers' logs as failed offset commits."""
    faults = []
    for path in sorted(log_dir.glob("consumer_*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "offset commit failed" in line:
                at = time.mktime(time.strptime(line[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone + float(line[19:23])
                faults.append(Fault(f"{path.stem}: {line[24:].strip()[:80]}", at - window, at, observed=True))
    return faults


# -- when firing resumed ---------------------------------------------------------------------


def longest_pause(sc: Traffic, fault_at: float, within: float = 150.0, *,
                  to_end: bool = False) -> tuple[float, float] | None:
    """(start, end) of the longest pause between two deliveries in the `within` seconds after a fault at
    `fault_at` began (from the fault itself to the first delivery, if none came sooner); with `to_end`, a
    stall from the last delivery to the window's end counts too (a window that ends with the fault's
    last step, not one longer than the scenario)."""
    sent, arrivals = sc.load.sent, sc.reader.arrivals
    end = fault_at + within
    times = sorted(t for m in sent if m in arrivals for t in arrivals[m] if fault_at <= t <= end)
    if to_end:
        times.append(end)
    if not times:
        return None
    return max(zip([fault_at, *times[:-1]], times), key=lambda pair: pair[1] - pair[0])


def resumed(sc: Traffic, fault_at: float, within: float = 150.0) -> tuple[float | None, dict[str, float]]:
    """When firing resumed after a fault at `fault_at`: the end of the longest pause between deliveries
    after it began (a fault that stops nothing leaves only the load's own short gaps, see
    `longest_pause`); and the jitter of the messages due from five seconds after that, sent ahead of their
    deadline."""
    pause = longest_pause(sc, fault_at, within)
    if pause is None:
        return None, {}
    resume = pause[1]
    sent, arrivals = sc.load.sent, sc.reader.arrivals
    late = [min(arrivals[m]) - s.due for m, s in sent.items()
            if m in arrivals and s.due >= resume + 5.0 and s.deadline > s.produced]
    return resume, percentiles(late) or {}
