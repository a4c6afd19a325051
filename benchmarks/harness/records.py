"""Per-message records shared between the harness's processes, without copying or locks.

One slot per message, indexed by its sequence number. Each array has exactly one writer:
the producer writes `deadline`, `sent_at` and `state`; the output reader writes `delivered_at`,
`created_at` and `copies` (the pgqueuer worker also rewrites `deadline` with the target the
queue really stored). The orchestrating process only reads, so no lock is needed.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from dataclasses import dataclass

import numpy as np

# `state` values
UNSENT, SENT, ACKED, FAILED = 0.0, 1.0, 2.0, -1.0

_FIELDS = ("deadline", "sent_at", "state", "delivered_at", "created_at", "copies")
_COUNTERS = ("sent", "acked", "failed", "delivered", "duplicates", "foreign", "t_first", "t_last",
             "producer_done")


class _Column:
    """One of the shared per-message arrays (`raw[name]`), read and written as a float64 numpy array."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, rec: "Records", owner: type | None = None) -> np.ndarray:
        return np.frombuffer(rec.raw[self.name], dtype=np.float64)


@dataclass
class Records:
    """Shared per-message arrays (float64, epoch seconds) and counters for one load step."""

    capacity: int
    raw: dict

    @classmethod
    def create(cls, ctx: mp.context.BaseContext, capacity: int) -> "Records":
        raw = {name: ctx.RawArray("d", capacity) for name in _FIELDS}
        raw.update({name: ctx.RawValue("d", 0.0) for name in _COUNTERS})
        rec = cls(capacity, raw)
        rec.delivered_at[:] = math.nan
        rec.created_at[:] = math.nan
        rec.deadline[:] = math.nan
        rec.sent_at[:] = math.nan
        return rec

    def __getstate__(self):
        return {"capacity": self.capacity, "raw": self.raw}

    def __setstate__(self, state):
        self.capacity, self.raw = state["capacity"], state["raw"]

    # the shared arrays, each seen as a numpy array without a copy
    deadline = _Column()
    sent_at = _Column()
    state = _Column()
    delivered_at = _Column()
    created_at = _Column()
    copies = _Column()

    def get(self, counter: str) -> float:
        return self.raw[counter].value

    def set(self, counter: str, value: float) -> None:
        self.raw[counter].value = value

    def add(self, counter: str, value: float = 1.0) -> None:
        self.raw[counter].value += value

    def overdue(self, now: float, grace: float) -> int:
        """Messages acknowledged by the input side, due more than `grace` s ago, not delivered yet."""
        n = int(self.get("sent"))
        d = self.deadline[:n]
        pending = (self.state[:n] == ACKED) & (d < now - grace) & np.isnan(self.delivered_at[:n])
        return int(np.count_nonzero(pending))
