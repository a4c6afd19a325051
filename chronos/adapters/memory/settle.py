"""The firer's settling statements on the in-memory database (`ports.SettleStore`): claimed rows deleted
once published, handed back, retried later or parked, each only while this node still holds them as it
claimed them."""

from __future__ import annotations

from typing import Sequence

from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import StoredRow
from chronos.domain import cron
from chronos.domain.model import Claimed, Parked


class MemorySettle(MemoryHandle):
    """The firer's settling side of the twin."""

    def _owned(self, row: StoredRow | None, claimed: Claimed) -> bool:
        """Whether this node still holds the row exactly as it claimed it (same claim time)."""
        return (row is not None and self.node_id is not None and row.readied_by == self.node_id
                and row.readied_us == cron.to_us(claimed.readied_at))

    def _held(self, claimed: Claimed) -> StoredRow | None:
        """The row as this node claimed it, if it still holds it: the same version (ctid, as
        PostgreSQL's statements reach it by TID) and the same claim."""
        row = self.db.rows.get(claimed.id)
        return row if row is not None and row.ctid == claimed.ctid and self._owned(row, claimed) else None

    def delete_fired(self, done: Sequence[Claimed]) -> int:
        """Delete exactly these rows if this node still owns them as claimed; returns how many."""
        def run(now: int) -> int:
            deleted = 0
            for c in done:
                if self._held(c) is not None:
                    del self.db.rows[c.id]
                    deleted += 1
            return deleted
        return self._run(run) if done else 0

    def release(self, rows: Sequence[Claimed]) -> int:
        """Hand claimed rows back so any firer takes them; returns how many were still this node's."""
        def run(now: int) -> int:
            released = 0
            for c in rows:
                if (row := self._held(c)) is not None:
                    row.readied_us, row.readied_by, row.ctid = None, None, self.db.new_ctid()
                    released += 1
            return released
        return self._run(run) if rows else 0

    def retry_later(self, failed: Sequence[tuple[Claimed, str, int]]) -> int:
        """Hand back rows whose publish was refused, each (row, error, delay_ms): the failure counted,
        the deadline moved by the delay, the deadline as scheduled kept."""
        def run(now: int) -> int:
            moved = 0
            for c, error, delay_ms in failed:
                if (row := self._held(c)) is not None:
                    if row.original_deadline_us is None:
                        row.original_deadline_us = row.deadline_us
                    row.deadline_us = max(row.deadline_us, now) + delay_ms * 1000
                    row.attempts += 1
                    row.last_error = error
                    row.readied_us, row.readied_by, row.ctid = None, None, self.db.new_ctid()
                    moved += 1
            return moved
        return self._run(run) if failed else 0

    def park_claimed(self, rows: Sequence[tuple[Claimed, str]], output_topic: str) -> int:
        """Move claimed rows, each (row, reason), to the parked messages; returns how many were still
        this node's."""
        def run(now: int) -> int:
            moved = 0
            for c, reason in rows:
                if (row := self._held(c)) is not None:
                    del self.db.rows[c.id]
                    self.db.park(Parked(row.id, f"store/{row.id}", row.topic or output_topic,
                                        cron.from_us(row.position[0]), row.key, row.value, row.headers, reason), now)
                    moved += 1
            return moved
        return self._run(run) if rows else 0
