"""The firers' shares of the due rows on PostgreSQL (`chronos.domain.shares`): a firer's lease in
chronos_firers, and the claim of its own slices, a range of the due index. One of the `Store`'s classes, over its
session; the SQL is in `sql/queries.sql`.
"""

from __future__ import annotations

import uuid
import psycopg

from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session
from chronos.domain.model import Claimed
from chronos.domain.shares import slice_span


class ShareStatements(Session):
    """The statements of `ports.ShareStore`."""

    def firer_heartbeat(self, hold_ms: int) -> dict[uuid.UUID, int]:
        """Renew this firer's lease (made at the first call) and drop the leases expired; the other
        firers whose lease is younger than `hold_ms`, each with its age in milliseconds, by the database
        clock."""
        params = {"node": self.node_id, "hold_ms": hold_ms}
        return self._run(lambda c: {r[0]: r[1] for r in self._execute(c, QUERIES["firer_heartbeat"], params,
                                                                        prepare=True)})

    def firer_leave(self) -> None:
        """Give this firer's slices up: its lease deleted."""
        self._run(lambda c: self._execute(c, QUERIES["firer_leave"], {"node": self.node_id}))

    def claim_share(self, slices: tuple[int, ...], limit: int, lookahead_ms: int,
                    window_ms: int | None = None) -> tuple[list[Claimed], bool]:
        """Claim up to `limit` rows of these slices due within `lookahead_ms` (with `window_ms`: due at
        most that long ago), in (deadline, seq) order. Returns (the rows, whether the claim came back full:
        a backlog)."""
        low, high, mask = slice_span(slices)
        params = {"node": self.node_id, "low": low, "high": high, "mask": mask, "limit": limit,
                  "lookahead_ms": lookahead_ms, "window_ms": window_ms}
        statement = QUERIES["claim_share" if window_ms is None else "claim_share_recent"]

        def run(conn: psycopg.Connection) -> tuple[list[Claimed], bool]:
            rows = [Claimed(*r) for r in self._execute(conn, statement, params, prepare=True).fetchall()]
            rows.sort(key=lambda r: (r.scheduled_us, r.seq))  # RETURNING has no order of its own
            return rows, len(rows) == limit
        return self._run(run)
