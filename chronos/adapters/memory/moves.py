"""A move of an input partition between cells on the in-memory database (`ports.MoveStore`): the source's record,
watch, freeze and rows, the target's rows put and woken. The watch keeps each row of the partition as it last
saw it (its ctid, which every write changes), so that what changed since is what differs; the freeze marks the
partition's rows, which the claim then passes over. A copy or a deletion walks the rows in enqueue order."""

from __future__ import annotations

import uuid
from typing import Callable, Sequence

from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import MoveState, StoredRow
from chronos.domain.cells import MOVING, OPEN, CellPartition
from chronos.domain.moves import (COPYING, DORMANT_FROM_US, MOVE_NODE, Change, MoveRecord, MovingRow, Woken,
                                  dormant_mark_us)

_GONE = -1  # the number of the change of a row no longer in the partition


def _moving(r: StoredRow) -> MovingRow:
    return MovingRow(r.id, r.deadline_us, r.topic, r.key, r.value, r.headers, r.ordering_key, r.input_partition,
                     r.cron, r.timezone, r.dst_policy, r.seq, r.enqueued_us, r.attempts, r.last_error,
                     r.original_deadline_us, r.last_occurrence_us)


def _number(ctid: str) -> int:
    return int(ctid.strip("()").split(",")[1])


class MemoryMoves(MemoryHandle):
    """The moves' side of the twin."""

    def moves(self) -> list[MoveRecord]:
        def run(now: int) -> list[MoveRecord]:
            return [MoveRecord(p, m.target, m.step, m.cursor, m.horizon_us, m.node, (now - m.seen_us) // 1000)
                    for p, m in sorted(self.db.moves.items())]
        return self._run(run)

    def begin_move(self, partition: int, target: str, node: uuid.UUID, ahead_ms: int) -> None:
        def run(now: int) -> None:
            self.db.moves.setdefault(partition, MoveState(target, COPYING, 0, now + ahead_ms * 1000, node, now))
        self._run(run)

    def lease_move(self, partition: int, node: uuid.UUID, lease_ms: int) -> bool:
        def run(now: int) -> bool:
            move = self.db.moves.get(partition)
            if move is None or (move.node != node and move.seen_us >= now - lease_ms * 1000):
                return False
            move.node, move.seen_us = node, now
            return True
        return self._run(run)

    def save_move(self, partition: int, node: uuid.UUID, step: str, cursor: int) -> bool:
        def run(now: int) -> bool:
            move = self.db.moves.get(partition)
            if move is None or move.node != node:
                return False
            move.step, move.cursor, move.seen_us = step, cursor, now
            return True
        return self._run(run)

    def end_move(self, partition: int) -> None:
        def run(now: int) -> None:
            self.db.moves.pop(partition, None)
            self.db.outbox.pop(partition, None)
            self.db.watched.pop(partition, None)  # a watch left in place notes nothing once the move is forgotten
        self._run(run)

    def _rows_of(self, partition: int) -> list[StoredRow]:
        return [r for r in self.db.rows.values() if r.input_partition == partition]

    def watch(self, partition: int, *, wait_ms: int = 0) -> bool:
        def run(now: int) -> bool:
            self.db.watched.setdefault(partition, {r.id: r.ctid for r in self._rows_of(partition)})
            return True
        return self._run(run)

    def freeze(self, partition: int) -> int | None:
        def run(now: int) -> int | None:
            listed = self.db.cell_partitions
            if partition not in listed:
                raise LookupError(f"this cell does not list partition {partition}")
            if listed[partition].state == OPEN:
                listed[partition] = CellPartition(partition, listed[partition].epoch + 1, MOVING)
            self.db.frozen.add(partition)
            for r in self._rows_of(partition):
                r.frozen = True
            return listed[partition].epoch
        return self._run(run)

    def unwatch(self, partition: int, *, wait_ms: int = 0) -> bool:
        def run(now: int) -> bool:
            self.db.watched.pop(partition, None)
            self.db.frozen.discard(partition)
            for r in self._rows_of(partition):
                r.frozen = False
            return True
        return self._run(run)

    def _stretch(self, cursor: int, rows: int) -> tuple[list[StoredRow], int | None]:
        """The next `rows` rows of any partition after `cursor` in enqueue order, and the cursor after them."""
        after = sorted((r for r in self.db.rows.values() if r.seq > cursor), key=lambda r: r.seq)[:rows]
        return after, (after[-1].seq if after else None)

    def scan(self, partition: int, cursor: int, after_us: int, rows: int) -> tuple[list[MovingRow], int | None]:
        def run(now: int) -> tuple[list[MovingRow], int | None]:
            stretch, last = self._stretch(cursor, rows)
            return ([_moving(r) for r in stretch
                     if r.input_partition == partition and r.cron is None and r.deadline_us > after_us], last)
        return self._run(run)

    def changes(self, partition: int, limit: int) -> list[Change]:
        def run(now: int) -> list[Change]:
            if partition not in self.db.watched:  # no watch: nothing noted, as on PostgreSQL
                return []
            seen = self.db.watched[partition]
            now_rows = {r.id: r for r in self._rows_of(partition)}
            found = [Change(mid, _number(now_rows[mid].ctid) if mid in now_rows else _GONE,
                            _moving(now_rows[mid]) if mid in now_rows else None)
                     for mid in seen.keys() | now_rows.keys()
                     if seen.get(mid) != (now_rows[mid].ctid if mid in now_rows else None)]
            return sorted(found, key=lambda c: (c.n, c.id))[:limit]
        return self._run(run)

    def forget(self, partition: int, changes: Sequence[Change]) -> None:
        def run(now: int) -> None:
            seen = self.db.watched.get(partition)
            if seen is None:
                return
            for change in changes:
                row = self.db.rows.get(change.id)
                if row is not None and row.input_partition != partition:
                    row = None
                if (row is None) != (change.n == _GONE) or (row is not None and _number(row.ctid) != change.n):
                    continue  # changed again since
                if row is None:
                    seen.pop(change.id, None)
                else:
                    seen[change.id] = row.ctid
        self._run(run)

    def held(self, partition: int, until_us: int) -> int:
        return self._run(lambda now: sum(1 for r in self._rows_of(partition)
                                         if (r.readied_us is not None and r.readied_us < DORMANT_FROM_US)
                                         or (r.held_by is not None and r.cron is None and r.deadline_us <= until_us)))

    def _waiting(self, partition: int, until_us: int) -> list[StoredRow]:
        """Its rows waiting here due up to `until_us`: not those a firer's claim that deletes holds."""
        return sorted((r for r in self._rows_of(partition)
                       if r.readied_us is None and r.held_by is None and r.cron is None and r.deadline_us <= until_us),
                      key=lambda r: (r.deadline_us, r.seq))

    def hand_over(self, partition: int, until_us: int, limit: int,
                  put: Callable[[Sequence[MovingRow]], object]) -> int | None:
        def run(now: int) -> int:
            # under the database's lock from the choice to the deletion, as PostgreSQL holds the rows' locks
            rows = self._waiting(partition, until_us)[:limit]
            if rows:
                put([_moving(r) for r in rows])
            return self._delete(rows)
        return self._run(run)

    def _delete(self, rows: Sequence[StoredRow]) -> int:
        """The move's own deletions: not noted by a watch."""
        for r in rows:
            del self.db.rows[r.id]
            if r.input_partition is not None:
                self.db.watched.get(r.input_partition, {}).pop(r.id, None)
        return len(rows)

    def ship_schedules(self, partition: int) -> list[MovingRow]:
        def run(now: int) -> list[MovingRow]:
            schedules = [r for r in self._rows_of(partition) if r.cron is not None]
            self._delete(schedules)
            shipped = self.db.outbox.setdefault(partition, [])
            shipped += schedules
            return [_moving(r) for r in shipped]
        return self._run(run)

    def shipped(self, partition: int) -> None:
        self._run(lambda now: self.db.outbox.pop(partition, None))

    def drop_due(self, partition: int, until_us: int, limit: int) -> int:
        return self._run(lambda now: self._delete(self._waiting(partition, until_us)[:limit]))

    def drop_scan(self, partition: int, cursor: int, rows: int) -> int | None:
        def run(now: int) -> int | None:
            stretch, last = self._stretch(cursor, rows)
            self._delete([r for r in stretch if r.input_partition == partition])
            return last
        return self._run(run)

    def seq_position(self) -> int:
        return self._run(lambda now: self.db.seq_last)

    def seq_at_least(self, seq: int) -> None:
        self._run(lambda now: self.db.seq_at_least(seq))

    def put(self, rows: Sequence[MovingRow], *, dormant: bool) -> int:
        def run(now: int) -> int:
            written = 0
            for r in rows:
                held = self.db.rows.get(r.id)
                if held is not None and held.readied_by != MOVE_NODE:
                    continue  # a message of the target's own
                self.db.rows[r.id] = StoredRow(
                    r.id, r.deadline_us, r.topic, r.key, r.value, r.headers or b"", r.ordering_key, r.cron, r.timezone,
                    r.dst_policy, r.seq, self.db.new_ctid(), r.enqueued_us,
                    readied_us=dormant_mark_us(r.deadline_us) if dormant else None,
                    readied_by=MOVE_NODE if dormant else None, attempts=r.attempts, last_error=r.last_error,
                    original_deadline_us=r.original_deadline_us, last_occurrence_us=r.last_occurrence_us,
                    input_partition=r.input_partition)
                written += 1
            return written
        return self._run(run)

    def drop_copies(self, ids: Sequence[str]) -> int:
        def run(now: int) -> int:
            return self._delete([self.db.rows[mid] for mid in dict.fromkeys(ids)
                                 if mid in self.db.rows and self.db.rows[mid].readied_by == MOVE_NODE])
        return self._run(run)

    def wake(self, partition: int, until_us: int | None, limit: int, after: int | None = None) -> Woken:
        def run(now: int) -> Woken:
            bound = dormant_mark_us(until_us) if until_us is not None else None
            dormant = sorted((r for r in self._rows_of(partition) if r.readied_by == MOVE_NODE
                              and r.readied_us is not None and (bound is None or r.readied_us <= bound)
                              and (after is None or r.readied_us >= after)),
                             key=lambda r: (r.readied_us, r.seq))[:limit]
            resume = dormant[-1].readied_us if dormant else None
            for r in dormant:
                r.readied_us, r.readied_by, r.ctid = None, None, self.db.new_ctid()
            return Woken(len(dormant), resume)
        return self._run(run)

    def live_firers(self, hold_ms: int) -> int:
        return self._run(lambda now: sum(1 for seen in self.db.firers.values() if seen > now - hold_ms * 1000))
