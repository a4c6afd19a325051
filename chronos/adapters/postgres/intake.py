"""The consumer's statements on PostgreSQL (`ports.IntakeStore`): a batch written, messages parked, which
late ids are waiting. Run on the store's session (`session.Session`)."""

from __future__ import annotations

import logging
import time
from typing import Iterable, Mapping, Sequence

import psycopg

from chronos import codec
from chronos.adapters.postgres.connection import one
from chronos.adapters.postgres.migrations import LATEST_VERSION
from chronos.adapters.postgres.queries import QUERIES, before_partition
from chronos.adapters.postgres.session import Session
from chronos.domain.cells import CANCEL, REPLACE, CellPartition, Fence, Forward
from chronos.domain.model import Parked, Row
from chronos.errors import CellMapChanged, CellsUnsupported, StoreUnavailable

log = logging.getLogger("chronos.store")

LOCK_RETRY_S = 0.01  # between two tries of a batch that waited for a row's lock up to the lock timeout


class IntakeStatements(Session):
    """The consumer's side of the store."""

    _reach_table = False  # whether the schema was found to have chronos_consumer_reach (`note_reach`)

    def insert(self, rows: Sequence[Row]) -> int:
        """Insert rows whose id is not waiting yet; returns how many were new."""
        return self.apply(rows, (), ())[0]

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row], cancels: Sequence[str],
              fence: Fence | None = None, *, forward: bool = False) -> tuple[int, int, int, int]:
        """One consumer batch in one transaction: COPY the inserts straight into the table (if an id
        is waiting already, the batch is written again with the inserts staged like the replaces,
        and only new ids inserted), COPY the replaces into the session's staging table and
        insert-or-replace from it, and cancel; with `forward` (cells), note the cancels that found nothing
        and the replaces, to forward to the other cells; then, with a `fence`, check it (CellMapChanged, the
        transaction rolled back, if it does not hold). Returns (inserted, replaced, cancelled,
        cancelled in flight): a cancelled row that a firer had already claimed is deleted all the
        same (nothing hands it back), but that firer may still publish it; one that a firer's claim
        that deletes holds is left to it (see `cancel` in queries.sql).

        A row a firer's claim that deletes holds keeps a write of the same id waiting until that
        firer's transaction ends (a replace; an id read again, in the COPY): the wait ends after
        the session's lock timeout, and the batch is written again, through the staging table, which
        leaves ids held alone, until the firer has let the row go (within the hold time, when it
        hangs: PostgreSQL ends its transaction). A row that stays locked for `lock_wait_s` makes
        the write fail as PostgreSQL out of reach does (StoreUnavailable)."""
        if not (inserts or replaces or cancels):
            return 0, 0, 0, 0

        def run(conn: psycopg.Connection) -> tuple[int, int, int, int]:
            if inserts:
                try:
                    return write(conn, direct=True)
                except (psycopg.errors.UniqueViolation, psycopg.errors.LockNotAvailable):
                    pass  # an id of the batch is waiting already (or held by a firer): insert only the others, below
            return write(conn, direct=False)

        def write(conn: psycopg.Connection, direct: bool) -> tuple[int, int, int, int]:
            # a schema before 12 (this release's processes run on 0.1.0's until `chronos migrate`) has no
            # input_partition: written without it; before 13, nothing is noted to forward
            version = self.schema_version if self.schema_version is not None else LATEST_VERSION
            partitioned, forwarding = version >= 12, forward and version >= 13

            def q(name: str) -> str:
                return QUERIES[name if partitioned else before_partition(name)]
            staged = (("u", replaces),) if direct else (("i", inserts), ("u", replaces))
            staging = bool(replaces) or not direct
            if staging and not self._staging_ready and not self.pooled:
                conn.execute(QUERIES["create_staging"])
                self._staging_ready = True
            inserted = replaced = cancelled = in_flight = 0
            # a batch of new ids only (the COPY, which has no plan) needs no settings but the lock timeout: an
            # id read again may be one a firer holds
            settings = staging or bool(cancels) or self.lock_timeout_ms is not None
            with self._transaction(conn, settings=settings, staging=staging):
                with conn.cursor() as cur:
                    if direct:
                        # the whole binary COPY stream built natively, handed over in one write: psycopg's
                        # write_row cost more per row than the rest of the consumer's batch path
                        with cur.copy(q("copy_messages")) as copy:
                            copy.write(codec.copy_rows(inserts, partitioned))
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
                        cur.execute(q("insert_from_staging"))
                        inserted = cur.rowcount
                    if replaces:
                        cur.execute(q("upsert_from_staging"))
                        replaced = cur.rowcount
                        if forwarding:
                            cur.execute(QUERIES["note_forwards"], {"ids": [r.id for r in replaces], "action": REPLACE})
                    if cancels:
                        found: dict[str, bool] = dict(cur.execute(QUERIES["cancel"], {"ids": list(cancels)}).fetchall())
                        in_flight = sum(found.values())
                        cancelled = len(found) - in_flight
                        missed = [mid for mid in cancels if mid not in found]
                        if forwarding and missed:
                            cur.execute(QUERIES["note_forwards"], {"ids": missed, "action": CANCEL})
                    if fence is not None:
                        check_fence(cur, fence)
            return inserted, replaced, cancelled, in_flight

        started = time.monotonic()
        while True:
            try:
                return self._run(run)
            except psycopg.errors.LockNotAvailable:
                waited = time.monotonic() - started
                if waited >= self.lock_wait_s:
                    raise StoreUnavailable(f"a row of the batch stayed locked for {waited:.1f}s (a firer's claim "
                                           f"that deletes holds it, or another writer)") from None
                log.debug("a row of the batch is locked (held by a firer until Kafka acknowledges it, for %.1fs "
                          "so far): writing the batch again", waited)
                time.sleep(LOCK_RETRY_S)

    def pending_forwards(self, limit: int) -> list[Forward]:
        """Up to `limit` of the cancels and replaces noted here to forward to the other cells, oldest first
        (none on a schema before 13, which notes none)."""
        def run(conn: psycopg.Connection) -> list[Forward]:
            if one(self._execute(conn, QUERIES["has_cell_moves"]))[0] is None:
                return []
            return [Forward(*r) for r in self._execute(conn, QUERIES["pending_forwards"], {"limit": limit})]
        return self._run(run)

    def cancel_forwarded(self, ids: Sequence[str]) -> dict[str, bool]:
        """Cancel these ids here, forwarded from another cell: each one found, with whether it was in flight."""
        if not ids:
            return {}
        return self._run(lambda c: dict(self._execute(c, QUERIES["cancel"], {"ids": list(ids)}).fetchall()))

    def forget_forwards(self, forwards: Sequence[Forward]) -> None:
        """These were forwarded to every other cell: forgotten, unless noted again since."""
        if forwards:
            self._run(lambda c: self._execute(c, QUERIES["forget_forwards"], {
                "ids": [f.id for f in forwards], "noted": [f.noted for f in forwards]}))

    def cell_partitions(self) -> list[CellPartition]:
        """The input partitions this cell lists, in order."""
        def run(conn: psycopg.Connection) -> list[CellPartition]:
            if one(self._execute(conn, QUERIES["has_cell_partitions"]))[0] is None:
                raise CellsUnsupported("this database's schema is before cells (version 11): run `chronos migrate`")
            return [CellPartition(*r) for r in self._execute(conn, QUERIES["cell_partitions"])]
        return self._run(run)

    def note_reach(self, group: str, reached_ms: Mapping[str, int]) -> dict[str, int] | None:
        """`ports.IntakeStore.note_reach`. Whether the schema has the table is asked until it has: a consumer may
        start before `chronos migrate` adds it."""
        def run(conn: psycopg.Connection) -> dict[str, int] | None:
            if not self._reach_table:
                if one(self._execute(conn, QUERIES["has_consumer_reach"]))[0] is None:
                    return None
                self._reach_table = True
            return dict(self._execute(conn, QUERIES["note_reach"], {
                "group": group, "node": self.node_id, "cells": list(reached_ms), "ms": list(reached_ms.values())}))
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
