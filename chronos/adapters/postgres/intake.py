"""The consumer's statements on PostgreSQL (`ports.IntakeStore`): a batch written, messages parked, which
late ids are waiting. Run on the store's session (`session.Session`)."""

from __future__ import annotations

from typing import Iterable, Sequence

import psycopg

from chronos import codec
from chronos.adapters.postgres.connection import one
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session
from chronos.domain.cells import CellPartition, Fence
from chronos.domain.model import Parked, Row
from chronos.errors import CellMapChanged, CellsUnsupported


class IntakeStatements(Session):
    """The consumer's side of the store."""

    def insert(self, rows: Sequence[Row]) -> int:
        """Insert rows whose id is not waiting yet; returns how many were new."""
        return self.apply(rows, (), ())[0]

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row], cancels: Sequence[str],
              fence: Fence | None = None) -> tuple[int, int, int, int]:
        """One consumer batch in one transaction: COPY the inserts straight into the table (if an id
        is waiting already, the batch is written again with the inserts staged like the replaces,
        and only new ids inserted), COPY the replaces into the session's staging table and
        insert-or-replace from it, and cancel; then, with a `fence`, check it (CellMapChanged, the
        transaction rolled back, if it does not hold). Returns (inserted, replaced, cancelled,
        cancelled in flight): a cancelled row that a firer had already claimed is deleted all the
        same (nothing hands it back), but that firer may still publish it."""
        if not (inserts or replaces or cancels):
            return 0, 0, 0, 0

        def run(conn: psycopg.Connection) -> tuple[int, int, int, int]:
            if inserts:
                try:
                    return write(conn, direct=True)
                except psycopg.errors.UniqueViolation:
                    pass  # an id of the batch is waiting already: insert only the others, below
            return write(conn, direct=False)

        def write(conn: psycopg.Connection, direct: bool) -> tuple[int, int, int, int]:
            staged = (("u", replaces),) if direct else (("i", inserts), ("u", replaces))
            staging = bool(replaces) or not direct
            if staging and not self._staging_ready and not self.pooled:
                conn.execute(QUERIES["create_staging"])
                self._staging_ready = True
            inserted = replaced = cancelled = in_flight = 0
            # a batch of new ids only (the COPY, which has no plan) needs no settings
            with self._transaction(conn, settings=staging or bool(cancels), staging=staging):
                with conn.cursor() as cur:
                    if direct:
                        # the whole binary COPY stream built natively, handed over in one write: psycopg's
                        # write_row cost more per row than the rest of the consumer's batch path
                        with cur.copy(QUERIES["copy_messages"]) as copy:
                            copy.write(codec.copy_rows(inserts))
                        inserted = len(inserts)
                    if replaces or not direct:
                        with cur.copy(QUERIES["copy_staging_full"]) as copy:
                            copy.set_types(["text", "int8", "text", "bytea", "bytea", "bytea", "text", "text",
                                            "text", "text", "text", "int4"])
                            for op, rows in staged:
                                for r in rows:
                                    copy.write_row((r.id, r.deadline_us, r.topic, r.key, r.value, r.headers,
                                                    r.ordering_key, r.cron, r.timezone, op, r.dst_policy,
                                                    r.input_partition))
                    if inserts and not direct:
                        cur.execute(QUERIES["insert_from_staging"])
                        inserted = cur.rowcount
                    if replaces:
                        cur.execute(QUERIES["upsert_from_staging"])
                        replaced = cur.rowcount
                    if cancels:
                        claimed = [r[0] for r in cur.execute(QUERIES["cancel"], {"ids": list(cancels)})]
                        in_flight = sum(claimed)
                        cancelled = len(claimed) - in_flight
                    if fence is not None:
                        check_fence(cur, fence)
            return inserted, replaced, cancelled, in_flight
        return self._run(run)

    def cell_partitions(self) -> list[CellPartition]:
        """The input partitions this cell lists, in order."""
        def run(conn: psycopg.Connection) -> list[CellPartition]:
            if one(self._execute(conn, QUERIES["has_cell_partitions"]))[0] is None:
                raise CellsUnsupported("this database's schema is before cells (version 11): run `chronos migrate`")
            return [CellPartition(*r) for r in self._execute(conn, QUERIES["cell_partitions"])]
        return self._run(run)

    def waiting_ids(self, ids: Iterable[str]) -> set[str]:
        ids = list(ids)
        if not ids:
            return set()
        return self._run(lambda c: {r[0] for r in self._execute(c, QUERIES["waiting_ids"], {"ids": ids})})

    def park(self, messages: Sequence[Parked]) -> None:
        """Keep messages no topic accepted, in one transaction."""
        if not messages:
            return

        def run(conn: psycopg.Connection) -> None:
            with self._transaction(conn), conn.cursor() as cur:
                cur.executemany(QUERIES["park_message"], [
                    {"message_id": m.message_id, "source": m.source, "topic": m.topic, "deadline": m.deadline,
                     "key": m.key, "value": m.value, "headers": m.headers, "reason": m.reason} for m in messages])
        self._run(run)


def check_fence(cur: psycopg.Cursor, fence: Fence) -> None:
    """The last statement of a fenced write: CellMapChanged (the caller's transaction rolled back) unless the
    cell still lists the partitions written at the fence's epochs."""
    if fence.epochs is None:
        found = cur.execute(QUERIES["cell_fence_whole"]).fetchall()
    else:
        found = cur.execute(QUERIES["cell_fence"], {"partitions": list(fence.epochs)}).fetchall()
    if not fence.holds(CellPartition(*r) for r in found):
        raise CellMapChanged("the cell map changed since it was read: this cell no longer owns "
                             "every partition written at the epoch known; nothing was written")
