"""The firers' shares of the due rows in the in-memory twin (`chronos.domain.shares`): the leases and
the claim of a firer's own slices, as `chronos.adapters.postgres.shares` has them. A mixin of
`MemoryStore`. A row's slice here is a CRC-32 of its ordering key, else of its id (PostgreSQL's
`hashtext` is not at hand): another cut than PostgreSQL's, with the same properties (a key's rows in
one slice, the ids spread evenly).
"""

from __future__ import annotations

import uuid
import zlib
from collections import Counter
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from chronos.domain.model import Claimed
from chronos.domain.shares import SLICES, slice_limits

if TYPE_CHECKING:
    from chronos.adapters.memory import MemoryDatabase, StoredRow

T = TypeVar("T")


def slice_of(row: StoredRow) -> int:
    """The row's slice: by its ordering key when it has one, so a key's rows share it."""
    return zlib.crc32((row.id if row.ordering_key is None else row.ordering_key).encode()) % SLICES


class _Handle(Protocol):
    """What the mixin uses of `MemoryStore`."""

    db: MemoryDatabase
    node_id: uuid.UUID | None

    def _run(self, fn: Callable[[int], T]) -> T: ...

    def _claim(self, now: int, limit: int, lookahead_ms: int, topic: object = ..., window_ms: int | None = None,
               pick: Callable[[list[StoredRow]], list[StoredRow]] | None = None) -> list[Claimed]: ...


class MemoryShares:
    """The statements of `ports.ShareStore`, on the twin's `MemoryDatabase.firers` (node → lease renewed at)."""

    def firer_heartbeat(self: _Handle, hold_ms: int) -> list[uuid.UUID]:
        """Renew this firer's lease and drop the leases expired; the other firers whose lease is younger
        than `hold_ms`."""
        def run(now: int) -> list[uuid.UUID]:
            firers, since = self.db.firers, now - hold_ms * 1000
            assert self.node_id is not None, "a firer's lease names its node"
            others = [node for node, seen in firers.items() if node != self.node_id and seen > since]
            for node in [node for node, seen in firers.items() if node != self.node_id and seen <= since]:
                del firers[node]
            firers[self.node_id] = now
            return others
        return self._run(run)

    def firer_leave(self: _Handle) -> None:
        """Give this firer's slices up: its lease deleted."""
        node = self.node_id
        if node is not None:
            self._run(lambda now: self.db.firers.pop(node, None))

    def claim_share(self: _Handle, slices: tuple[int, ...], limit: int, lookahead_ms: int,
                    window_ms: int | None = None) -> tuple[list[Claimed], bool]:
        """Claim up to `limit` rows of these slices, each slice up to its share of the limit; (the rows,
        whether a slice filled its share). See the PostgreSQL store's `claim_share`."""
        kept, limits = slice_limits(slices, limit)
        shares = dict(zip(kept, limits))

        def pick(ordered: list[StoredRow]) -> list[StoredRow]:
            taken: Counter[int] = Counter()
            chosen = []
            for r in ordered:
                at = slice_of(r)
                if taken[at] < shares.get(at, 0):
                    taken[at] += 1
                    chosen.append(r)
            return chosen

        def run(now: int) -> tuple[list[Claimed], bool]:
            rows = self._claim(now, limit, lookahead_ms, window_ms=window_ms, pick=pick)
            per_slice = Counter(slice_of(self.db.rows[r.id]) for r in rows)
            return rows, any(per_slice[s] >= n for s, n in shares.items())
        return self._run(run)
