"""The detector's statements on the in-memory database (`ports.DetectStore`): rows held past the hold time
found and handed back, and the gauges (`overview`, also `chronos status`'s; `throttled`)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Sequence

from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import StoredRow
from chronos.domain import cron
from chronos.domain.model import DUE_CAP, ESTIMATE_ABOVE, NodeLoad, Overview, Stale, Throttled


class MemoryDetect(MemoryHandle):
    """The detector's side of the twin."""

    def find_stale(self, hold_ms: int, limit: int = 10000) -> list[Stale]:
        """Rows claimed longer ago than the hold time, oldest claim first."""
        def run(now: int) -> list[Stale]:
            held = sorted((r for r in self.db.rows.values()
                           if r.readied_us is not None and r.readied_us < now - hold_ms * 1000),
                          key=lambda r: _readied(r))[:limit]
            return [Stale(r.id, cron.from_us(_readied(r)), _holder(r), r.ctid) for r in held]
        return self._run(run)

    def reset_stale(self, seen: Sequence[Stale]) -> list[uuid.UUID]:
        """Reset the rows whose claim is still what the detector saw; returns their holders."""
        def run(now: int) -> list[uuid.UUID]:
            reset = []
            for s in seen:
                row = self.db.rows.get(s.id)
                if (row is not None and row.ctid == s.ctid and row.readied_by == s.readied_by
                        and row.readied_us == cron.to_us(s.readied_at)):
                    row.readied_us, row.readied_by, row.ctid = None, None, self.db.new_ctid()
                    reset.append(s.readied_by)
            return reset
        return self._run(run) if seen else []

    def overview(self, hold_ms: int, *, exact: bool | None = None) -> Overview:
        """What `chronos status` shows; the waiting count is exact below ESTIMATE_ABOVE rows (or
        with exact=True), else the row count less the claimed rows and schedules, as PostgreSQL's
        estimate would be."""
        def run(now: int) -> Overview:
            rows = list(self.db.rows.values())
            by_node: dict[uuid.UUID, list[tuple[int, StoredRow]]] = {}
            for r in rows:
                if (holder := r.holder) is not None:
                    by_node.setdefault(holder[0], []).append((holder[1], r))
            nodes = [NodeLoad(node, len(held), sum(1 for since, _ in held if since < now - hold_ms * 1000),
                              (now - min(since for since, _ in held)) / 1e6,
                              cron.from_us(min(r.deadline_us for _, r in held)))
                     for node, held in by_node.items()]
            nodes.sort(key=lambda n: (-n.rows, n.node))
            waiting = [r.deadline_us for r in rows if r.waiting]
            later = [d for d in waiting if d > now]
            count = exact if exact is not None else len(rows) < ESTIMATE_ABOVE
            return Overview.build(cron.from_us(now), _first(waiting), _first(later), len(waiting) if count else None,
                                  len(rows), min(DUE_CAP, len(waiting) - len(later)), nodes,
                                  sum(1 for r in rows if r.cron is not None), len(self.db.parked))
        return self._run(run)

    def gauge_reader(self, within_ms: int) -> uuid.UUID | None:
        """The first by node of the detectors that said where they serve within the last `within_ms`."""
        return self._run(lambda now: min((node for node, (role, _, at) in self.db.processes.items()
                                          if role == "detector" and at > now - within_ms * 1000), default=None))

    def throttled(self, output_topic: str) -> list[Throttled]:
        """Per topic with a bucket refilled within the last minute: due rows not claimed, and lateness."""
        def run(now: int) -> list[Throttled]:
            found = []
            for name in sorted(self.db.buckets):
                bucket = self.db.buckets[name]
                if bucket.refilled_us <= now - 60_000_000:
                    continue
                topic = None if name == output_topic else name
                due = [r.deadline_us for r in self.db.rows.values()
                       if r.waiting and r.topic == topic and r.deadline_us <= now]
                lateness = max(0.0, (now - min(due)) / 1e6) if due else 0.0
                found.append(Throttled(name, bucket.rate, min(len(due), DUE_CAP), lateness))
            return found
        return self._run(run)


def _readied(row: StoredRow) -> int:
    assert row.readied_us is not None
    return row.readied_us


def _holder(row: StoredRow) -> uuid.UUID:
    assert row.readied_by is not None
    return row.readied_by


def _first(deadlines: list[int]) -> datetime | None:
    return cron.from_us(min(deadlines)) if deadlines else None
