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

    def _array(self, name: str) -> np.ndarray:
        return np.frombuffer(self.raw[name], dtype=np.float64)

    @property
    def deadline(self) -> np.ndarray:
        return self._array("deadline")

    @property
    def sent_at(self) -> np.ndarray:
        return self._array("sent_at")

    @property
    def state(self) -> np.ndarray:
        return self._array("state")

    @property
    def delivered_at(self) -> np.ndarray:
        return self._array("delivered_at")

    @property
    def created_at(self) -> np.ndarray:
        return self._array("created_at")

    @property
    def copies(self) -> np.ndarray:
        return self._array("copies")

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
