"""The firers' shares of the due rows on PostgreSQL (`chronos.domain.shares`): a firer's lease in
chronos_firers (the claim of its own slices is with the other claims, `ClaimStatements.claim_share`). One of
the `Store`'s classes, over its session; the SQL is in `sql/queries.sql`.
"""

from __future__ import annotations

import uuid

from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session


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
