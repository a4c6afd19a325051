"""The consumer's statements on the in-memory database (`ports.IntakeStore`): a batch written (fenced, with
cells), messages parked, which late ids are waiting, the input partitions this cell owns."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import StoredRow
from chronos.domain.cells import CellPartition, Fence
from chronos.domain.model import Parked, Row
from chronos.errors import CellMapChanged, StoreRejected


class MemoryIntake(MemoryHandle):
    """The consumer's side of the twin."""

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row], cancels: Sequence[str],
              fence: Fence | None = None) -> tuple[int, int, int, int]:
        """One consumer batch, all or nothing: insert new ids, insert-or-replace, cancel; nothing, and
        CellMapChanged, when a `fence` does not hold. Returns (inserted, replaced, cancelled, cancelled in
        flight), as the PostgreSQL store does."""
        if not (inserts or replaces or cancels):
            return 0, 0, 0, 0
        seen: set[str] = set()
        for r in replaces:
            if r.id in seen:  # PostgreSQL refuses the whole batch the same way
                raise StoreRejected(f"ON CONFLICT DO UPDATE command cannot affect row a second time (id {r.id!r})")
            seen.add(r.id)

        def run(now: int) -> tuple[int, int, int, int]:
            db = self.db
            if fence is not None:
                listed = db.cell_partitions
                found = (list(listed.values())[:1] if fence.epochs is None
                         else [listed[p] for p in fence.epochs if p in listed])
                if not fence.holds(found):
                    raise CellMapChanged("the cell map changed since it was read: this cell no longer owns "
                                         "every partition written at the epoch known; nothing was written")
            inserted = replaced = cancelled = in_flight = 0
            for r in inserts:
                if r.id not in db.rows:
                    db.rows[r.id] = self._new_row(r, now)
                    inserted += 1
            for r in replaces:
                old = db.rows.get(r.id)
                if old is None:
                    db.rows[r.id] = self._new_row(r, now)
                elif old.frozen:
                    continue  # its partition's move froze it here: left as it is
                else:  # the new version, waiting, with no failed publishes; seq and last occurrence kept
                    db.rows[r.id] = replace(self._new_row(r, now, seq=old.seq), last_occurrence_us=old.last_occurrence_us)
                replaced += 1
            for mid in dict.fromkeys(cancels):
                gone = db.rows.get(mid)
                if gone is not None and gone.frozen:
                    continue
                gone = db.rows.pop(mid, None)
                if gone is not None:
                    if gone.readied_us is None:
                        cancelled += 1
                    else:
                        in_flight += 1
            return inserted, replaced, cancelled, in_flight
        return self._run(run)

    def _new_row(self, r: Row, now: int, seq: int | None = None) -> StoredRow:
        return StoredRow(r.id, r.deadline_us, r.topic, r.key, r.value, r.headers, r.ordering_key, r.cron,
                         r.timezone, r.dst_policy, self.db.next_seq() if seq is None else seq, self.db.new_ctid(), now,
                         input_partition=r.input_partition, frozen=r.input_partition in self.db.frozen)

    def waiting_ids(self, ids: Iterable[str]) -> set[str]:
        """Which of these ids the store holds (waiting, claimed or a recurring schedule)."""
        wanted = set(ids)
        return self._run(lambda now: wanted & self.db.rows.keys()) if wanted else set()

    def park(self, messages: Sequence[Parked]) -> None:
        """Keep messages no topic accepted."""
        def run(now: int) -> None:
            for m in messages:
                self.db.park(replace(m), now)
        if messages:
            self._run(run)

    def cell_partitions(self) -> list[CellPartition]:
        """The input partitions this cell lists, in order."""
        return self._run(lambda now: [self.db.cell_partitions[p] for p in sorted(self.db.cell_partitions)])
