"""Changes of this cell's list of input partitions on PostgreSQL (`ports.CellMapStore`), each in a transaction
that first locks the list against the consumers' fenced writes (cell_map_lock). Run on the store's session
(`session.Session`)."""

from __future__ import annotations

from typing import Sequence

import psycopg

from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session


class CellMapStatements(Session):
    """The map's side of the store."""

    def open_partitions(self, partitions: Sequence[int], epoch: int) -> list[int]:
        """List these partitions here, open, at `epoch`; returns those opened."""
        def run(conn: psycopg.Connection) -> list[int]:
            with self._transaction(conn, settings=False):
                conn.execute(QUERIES["cell_map_lock"])
                return sorted(r[0] for r in conn.execute(QUERIES["open_cell_partitions"],
                                                         {"partitions": list(partitions), "epoch": epoch}))
        return self._run(run)

    def close_partitions(self, partitions: Sequence[int]) -> dict[int, int]:
        """Mark these partitions moving at their epoch + 1; returns partition -> new epoch."""
        def run(conn: psycopg.Connection) -> dict[int, int]:
            with self._transaction(conn, settings=False):
                conn.execute(QUERIES["cell_map_lock"])
                return dict(sorted(conn.execute(QUERIES["close_cell_partitions"],
                                                {"partitions": list(partitions)}).fetchall()))
        return self._run(run)
