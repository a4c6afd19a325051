"""The firers' leases in the in-memory twin (`chronos.domain.shares`), as `chronos.adapters.postgres.shares`
has them; the claim of a firer's own slices is with the other claims (`claims.MemoryClaims.claim_share`). A
row's slice here is a CRC-32 of its ordering key, else of its id (PostgreSQL's `hashtext` is not at hand):
another cut than PostgreSQL's, with the same properties (a key's rows in one slice, the ids spread evenly).
"""

from __future__ import annotations

import uuid
import zlib

from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import StoredRow
from chronos.domain.shares import SLICES


def slice_of(row: StoredRow) -> int:
    """The row's slice: by its ordering key when it has one, so a key's rows share it."""
    return zlib.crc32((row.id if row.ordering_key is None else row.ordering_key).encode()) % SLICES


class MemoryShares(MemoryHandle):
    """The firers' leases, on the twin's `MemoryDatabase.firers` (node -> lease renewed at)."""

    def firer_heartbeat(self, hold_ms: int) -> dict[uuid.UUID, int]:
        """Renew this firer's lease and drop the leases expired; the other firers whose lease is younger
        than `hold_ms`, each with its age in milliseconds."""
        def run(now: int) -> dict[uuid.UUID, int]:
            firers, since = self.db.firers, now - hold_ms * 1000
            assert self.node_id is not None, "a firer's lease names its node"
            others = {node: (now - seen) // 1000 for node, seen in firers.items()
                      if node != self.node_id and seen > since}
            for node in [node for node, seen in firers.items() if node != self.node_id and seen <= since]:
                del firers[node]
            firers[self.node_id] = now
            return others
        return self._run(run)

    def firer_leave(self) -> None:
        """Give this firer's slices up: its lease deleted."""
        node = self.node_id
        if node is not None:
            self._run(lambda now: self.db.firers.pop(node, None))
