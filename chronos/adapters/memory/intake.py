"""The consumer's statements on the in-memory database (`ports.IntakeStore`): a batch written (fenced, with
cells), messages parked, which late ids are waiting, the input partitions this cell owns."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import StoredRow
from chronos.domain.cells import CANCEL, REPLACE, CellPartition, Fence, Forward
from chronos.domain.model import Parked, Row
from chronos.errors import CellMapChanged, StoreRejected


class MemoryIntake(MemoryHandle):
    """The consumer's side of the twin."""

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row], cancels: Sequence[str],
              fence: Fence | None = None, *, forward: bool = False) -> tuple[int, int, int, int]:
        """One consumer batch, all or nothing: insert new ids, insert-or-replace, cancel (with `forward`, the
        cancels that found nothing and the replaces noted to forward); nothing, and CellMapChanged, when a
        `fence` does not hold. Returns (inserted, replaced, cancelled, cancelled in flight), as the PostgreSQL
        store does."""
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
                else:  # the new version, waiting, with no failed publishes; seq and last occurrence kept. (A row
                    # held by a claim that deletes is replaced at once: PostgreSQL waits for that firer's
                    # transaction to end, then writes the new version all the same.)
                    db.rows[r.id] = replace(self._new_row(r, now, seq=old.seq), last_occurrence_us=old.last_occurrence_us)
                replaced += 1
            missed = []
            for mid in dict.fromkeys(cancels):
                gone = db.rows.get(mid)
                if gone is None or gone.frozen:
                    missed.append(mid)
                    continue
                if gone.held_by is not None:  # left to the firer whose claim that deletes holds it
                    in_flight += 1
                    continue
                del db.rows[mid]
                if gone.readied_us is None:
                    cancelled += 1
                else:
                    in_flight += 1
            if forward:
                db.note_forwards((r.id for r in replaces), REPLACE)
                db.note_forwards(missed, CANCEL)
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

    def pending_forwards(self, limit: int) -> list[Forward]:
        """Up to `limit` of the cancels and replaces noted here to forward, oldest first."""
        return self._run(lambda now: [Forward(mid, action, noted) for mid, (action, noted)
                                      in sorted(self.db.forwards.items(), key=lambda f: f[1][1])[:limit]])

    def cancel_forwarded(self, ids: Sequence[str]) -> dict[str, bool]:
        """Cancel these ids here, forwarded from another cell: each one found, with whether it was in flight."""
        def run(now: int) -> dict[str, bool]:
            found = {}
            for mid in dict.fromkeys(ids):
                row = self.db.rows.get(mid)
                if row is not None and not row.frozen:
                    del self.db.rows[mid]
                    found[mid] = row.readied_us is not None
            return found
        return self._run(run)

    def forget_forwards(self, forwards: Sequence[Forward]) -> None:
        """Forwarded to every other cell: forgotten, unless noted again since."""
        def run(now: int) -> None:
            for f in forwards:
                if self.db.forwards.get(f.id, (None, None))[1] == f.noted:
                    del self.db.forwards[f.id]
        self._run(run)

    def note_reach(self, group: str, reached_ms: Mapping[str, int]) -> dict[str, int] | None:
        """`ports.IntakeStore.note_reach`: said at the database's time less each age, never moved back; the
        rows not renewed for a day dropped."""
        assert self.node_id is not None, "a consumer's store has its node"
        node = self.node_id

        def run(now: int) -> dict[str, int]:
            reach = self.db.reach
            for key in [k for k, at in reach.items() if now - at > 86_400_000_000]:
                del reach[key]
            for cell, ms in reached_ms.items():
                key = (group, node, cell)
                reach[key] = max(reach.get(key, now - ms * 1000), now - ms * 1000)
            latest: dict[str, int] = {}
            for (g, n, cell), at in reach.items():
                if g == group and n != node:
                    latest[cell] = max(latest.get(cell, at), at)
            return {cell: (now - at) // 1000 for cell, at in sorted(latest.items())}
        return self._run(run)

    def cell_partitions(self) -> list[CellPartition]:
        """The input partitions this cell lists, in order."""
        return self._run(lambda now: [self.db.cell_partitions[p] for p in sorted(self.db.cell_partitions)])
