"""A move of an input partition between cells on PostgreSQL (`ports.MoveStore`): the source's record, watch,
freeze and rows, the target's rows put and woken. Run on the store's session (`session.Session`), as the
database's owner (the watch and the freeze are triggers on the table).

The copy and the deletion walk the table a stretch of blocks at a time, by TID range: finding a partition's rows
takes no index, which every write of the consumers would pay for. The triggers (the watch, and the freeze armed
by the map from the cut-over on) are made when the move begins and dropped when it ends, with the table's lock
taken only if it is free at once: while a request for it waits, every write waits behind it, so a busy table
makes it give up at once, and the caller tries again a little later (after many tries, waiting for the lock,
longer each time: a table never free at once, its writers back to back, such as firers whose claims delete, each
batch a transaction held open until Kafka acknowledged it). The cut-over
takes no lock of the table: it closes the partition in the map, which arms the freeze, and hands the rows over
with row locks, which wait only for the transactions that hold those rows."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Sequence, TypeVar

import psycopg

from chronos.adapters.postgres.connection import one
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session
from chronos.domain.moves import DORMANT_FROM_US, MOVE_NODE, Change, MoveRecord, MovingRow, Woken, dormant_mark_us
from chronos.errors import CellsUnsupported

#: Blocks of the table a copy or a deletion reads per call (8 kB each) at most, whatever rows they hold.
SCAN_BLOCKS = 2048
#: Rows a block of the table is taken to hold before PostgreSQL counted them (a row of a few hundred bytes).
ROWS_PER_BLOCK = 32
#: How long a change of the table's triggers, or of the map, waits for its lock before it gives up
#: (milliseconds); and a hand-over for the rows it takes, which a statement under way holds a moment.
LOCK_TIMEOUT_MS = 50
#: The schema a move needs: its freeze armed by the map (migration 14).
MOVES_VERSION = 14
_WATCH = ("inserts", "updates", "deletes")
_TRIGGERS = (*_WATCH, "freeze")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


T = TypeVar("T")


def _ts(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _tid(block: int) -> str:
    return f"({block},0)"


def _row(r: Sequence[Any]) -> MovingRow:
    return MovingRow(*r)


class MoveStatements(Session):
    """The moves' side of the store."""

    def moves(self) -> list[MoveRecord]:
        def run(conn: psycopg.Connection) -> list[MoveRecord]:
            if one(self._execute(conn, QUERIES["has_cell_moves"]))[0] is None or \
                    one(self._execute(conn, QUERIES["schema_version"]))[0] < MOVES_VERSION:
                raise CellsUnsupported(f"this cell's database schema is before moves (version {MOVES_VERSION}): "
                                       f"run `chronos migrate` on it")
            return [MoveRecord(*r) for r in self._execute(conn, QUERIES["move_records"])]
        return self._run(run)

    def begin_move(self, partition: int, target: str, node: uuid.UUID, ahead_ms: int) -> None:
        self._run(lambda c: self._execute(c, QUERIES["move_begin"], {"partition": partition, "target": target,
                                                                     "node": node, "ahead_ms": ahead_ms}))

    def lease_move(self, partition: int, node: uuid.UUID, lease_ms: int) -> bool:
        return self._run(lambda c: self._execute(c, QUERIES["move_lease"], {
            "partition": partition, "node": node, "lease_ms": lease_ms}).fetchone() is not None)

    def save_move(self, partition: int, node: uuid.UUID, step: str, cursor: int) -> bool:
        return self._run(lambda c: self._execute(c, QUERIES["move_save"], {
            "partition": partition, "node": node, "step": step, "cursor": cursor}).fetchone() is not None)

    def end_move(self, partition: int) -> None:
        self._run(lambda c: self._execute(c, QUERIES["move_end"], {"partition": partition}))

    def _locking(self, body: Callable[[psycopg.Connection], T], *, by_itself: bool = False,
                 wait_ms: int = LOCK_TIMEOUT_MS) -> T | None:
        """`body` in one transaction whose locks are waited for `wait_ms` at most, the short lock timeout unless
        told (`by_itself`: one of the move's own statements, neither noted nor held back); None when one was not
        had within it."""
        def run(conn: psycopg.Connection) -> T:
            with conn.transaction():
                if by_itself:
                    conn.execute(QUERIES["move_by_itself"])
                conn.execute(QUERIES["move_lock_timeout"], {"ms": max(1, int(wait_ms))})
                return body(conn)
        try:
            return self._run(run)
        except psycopg.errors.LockNotAvailable:
            return None

    def _ddl(self, partition: int, names: Sequence[tuple[str, str]], lock: str, wait_ms: int) -> bool:
        """The triggers' statements (name, trigger) for the partition in one transaction, the table's lock `lock`
        taken first, if free at once (or with `wait_ms`, within that); False when it was not."""
        p = int(partition)  # put into the statement, not bound: an integer only

        def run(conn: psycopg.Connection) -> bool:
            conn.execute(QUERIES[lock if wait_ms > 0 else f"{lock}_now"])
            for name, trigger in names:
                conn.execute(QUERIES[name].format(partition=p, trigger=trigger))
            return True
        return self._locking(run, wait_ms=wait_ms or LOCK_TIMEOUT_MS) is not None

    def watch(self, partition: int, *, wait_ms: int = 0) -> bool:
        # the freeze too, inert while the partition is open here (migration 14): the cut-over changes no trigger
        return self._ddl(partition, [(f"move_watch_{kind}", "") for kind in _WATCH] + [("move_freeze", "")],
                         "move_lock_to_make", wait_ms)

    def freeze(self, partition: int) -> int | None:
        p = int(partition)

        def run(conn: psycopg.Connection) -> Any:
            if not one(conn.execute(QUERIES["move_has_freeze"], {"name": f"chronos_move_{p}_freeze"}))[0]:
                # not made with a watch: made now, under the table's lock (the table before the map, as the
                # consumers' writes take them)
                conn.execute(QUERIES["move_freeze"].format(partition=p))
            conn.execute(QUERIES["cell_map_lock"])  # the consumers' writes that checked their fence end
            return conn.execute(QUERIES["move_close"], {"partition": p}).fetchone() or ()
        found = self._locking(run)
        if found is None:
            return None
        if not found:
            raise LookupError(f"this cell does not list partition {partition}")
        return int(found[0])

    def unwatch(self, partition: int, *, wait_ms: int = 0) -> bool:
        return self._ddl(partition, [("move_unwatch", trigger) for trigger in _TRIGGERS], "move_lock_to_drop", wait_ms)

    def _stretch(self, conn: psycopg.Connection, cursor: int, rows: int) -> int | None:
        """The block after a stretch of about `rows` of the table's rows from `cursor` (by the table's rows per
        block as last counted), or None at the table's end."""
        blocks, per_block = one(self._execute(conn, QUERIES["move_blocks"]))
        if cursor >= blocks:
            return None
        return cursor + max(1, min(SCAN_BLOCKS, int(rows / (per_block or ROWS_PER_BLOCK))))

    def scan(self, partition: int, cursor: int, after_us: int, rows: int) -> tuple[list[MovingRow], int | None]:
        def run(conn: psycopg.Connection) -> tuple[list[MovingRow], int | None]:
            last = self._stretch(conn, cursor, rows)
            if last is None:
                return [], None
            return [_row(r) for r in self._execute(conn, QUERIES["move_scan"], {
                "partition": partition, "first": _tid(cursor), "last": _tid(last), "after": _ts(after_us)})], last
        return self._run(run)

    def changes(self, partition: int, limit: int) -> list[Change]:
        def run(conn: psycopg.Connection) -> list[Change]:
            return [Change(r[0], r[1], _row(r[2:]) if r[2] is not None else None)
                    for r in self._execute(conn, QUERIES["move_changes"], {"partition": partition, "limit": limit})]
        return self._run(run)

    def forget(self, partition: int, changes: Sequence[Change]) -> None:
        if changes:
            self._run(lambda c: self._execute(c, QUERIES["move_forget"], {
                "partition": partition, "ids": [ch.id for ch in changes], "ns": [ch.n for ch in changes]}))

    def held(self, partition: int, until_us: int) -> int:
        return self._run(lambda c: one(self._execute(c, QUERIES["move_in_flight"], {
            "partition": partition, "dormant_from": _ts(DORMANT_FROM_US), "until": _ts(until_us)}))[0])

    def hand_over(self, partition: int, until_us: int, limit: int,
                  put: Callable[[Sequence[MovingRow]], object]) -> int | None:
        def run(conn: psycopg.Connection) -> int:
            rows = [_row(r) for r in conn.execute(QUERIES["move_near"], {
                "partition": partition, "until": _ts(until_us), "limit": limit})]
            if not rows:
                return 0
            put(rows)
            return conn.execute(QUERIES["move_take"], {"partition": partition, "ids": [r.id for r in rows]}).rowcount
        return self._locking(run, by_itself=True)

    def _by_itself(self, statement: str, params: dict[str, Any]) -> psycopg.Cursor:
        """One of the move's own statements, in a transaction of its own, neither noted nor held back."""
        def run(conn: psycopg.Connection) -> psycopg.Cursor:
            with conn.transaction():
                conn.execute(QUERIES["move_by_itself"])
                return conn.execute(QUERIES[statement], params)
        return self._run(run)

    def ship_schedules(self, partition: int) -> list[MovingRow]:
        self._by_itself("move_ship_schedules", {"partition": partition})
        return self._run(lambda c: [_row(r) for r in self._execute(c, QUERIES["move_outbox"],
                                                                   {"partition": partition})])

    def shipped(self, partition: int) -> None:
        self._run(lambda c: self._execute(c, QUERIES["move_outbox_done"], {"partition": partition}))

    def drop_due(self, partition: int, until_us: int, limit: int) -> int:
        return self._by_itself("move_drop_due", {"partition": partition, "until": _ts(until_us),
                                                 "limit": limit}).rowcount

    def drop_scan(self, partition: int, cursor: int, rows: int) -> int | None:
        last = self._run(lambda c: self._stretch(c, cursor, rows))
        if last is not None:
            self._by_itself("move_drop_scan", {"partition": partition, "first": _tid(cursor), "last": _tid(last)})
        return last

    def seq_position(self) -> int:
        return self._run(lambda c: one(self._execute(c, QUERIES["move_seq"]))[0])

    def seq_at_least(self, seq: int) -> None:
        self._run(lambda c: self._execute(c, QUERIES["move_seq_at_least"], {"seq": seq}))

    def put(self, rows: Sequence[MovingRow], *, dormant: bool) -> int:
        if not rows:
            return 0

        def run(conn: psycopg.Connection) -> int:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(QUERIES["create_move_rows"])
                with cur.copy(QUERIES["copy_move_rows"]) as copy:
                    copy.set_types(["text", "int8", "text", "bytea", "bytea", "bytea", "text", "int4", "text", "text",
                                    "text", "int8", "int8", "int4", "text", "int8", "int8", "int8"])
                    for r in rows:
                        copy.write_row((r.id, r.deadline_us, r.topic, r.key, r.value, r.headers, r.ordering_key,
                                        r.input_partition, r.cron, r.timezone, r.dst_policy, r.seq, r.enqueued_us,
                                        r.attempts, r.last_error, r.original_deadline_us, r.last_occurrence_us,
                                        dormant_mark_us(r.deadline_us) if dormant else None))
                cur.execute(QUERIES["move_put"], {"node": MOVE_NODE})
                return cur.rowcount
        return self._run(run)

    def drop_copies(self, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        return self._run(lambda c: self._execute(c, QUERIES["move_drop_copies"], {
            "ids": list(ids), "node": MOVE_NODE}).rowcount)

    def wake(self, partition: int, until_us: int | None, limit: int, after: int | None = None) -> Woken:
        until = dormant_mark_us(until_us) if until_us is not None else dormant_mark_us(253_402_300_799_999_999)
        count, last = self._run(lambda c: one(self._execute(c, QUERIES["move_wake"], {
            "partition": partition, "from": _ts(max(DORMANT_FROM_US, after or 0)), "until": _ts(until),
            "node": MOVE_NODE, "limit": limit})))
        return Woken(count, None if last is None else (last - _EPOCH) // timedelta(microseconds=1))

    def live_firers(self, hold_ms: int) -> int:
        return self._run(lambda c: one(self._execute(c, QUERIES["live_firers"], {"hold_ms": hold_ms}))[0])
