"""The one-by-one fallback: PostgreSQL refused a batch's write, so each of its operations is applied
alone, and only the rows it refuses are dead-lettered."""

from __future__ import annotations

import logging

from chronos import codec
from chronos.domain import reasons
from chronos.domain.cells import Fence
from chronos.errors import StoreRejected
from chronos.ports import IntakeStore
from chronos.roles.consumer.sorting import CANCEL, INSERT, REPLACE, Batch

log = logging.getLogger("chronos.consumer")


def apply_one_by_one(store: IntakeStore, batch: Batch, exc: StoreRejected,
                     fence: Fence | None = None, *, forward: bool = False) -> tuple[int, int, int, int]:
        """PostgreSQL refused the batch: find the rows it refuses and dead-letter only those (each write with
        the batch's `fence` and `forward`, with cells)."""
        log.warning("postgres refused a batch of %d operations (%s); applying them one by one", len(batch.ops), exc)
        totals = [0, 0, 0, 0]
        for message_id, (op, row) in list(batch.ops.items()):
            try:
                rows = [row] if row is not None else []  # only a cancel has no row
                done = store.apply(rows if op == INSERT else [], rows if op == REPLACE else [],
                                   [message_id] if op == CANCEL else [], fence, forward=forward)
            except StoreRejected as row_exc:
                del batch.ops[message_id]
                msg = batch.sources[message_id]
                # its headers were read once without fault (else it would not have a row): read again
                batch.dead.append((msg, f"{reasons.STORE_REJECTED}: {row_exc}", codec.read_headers(msg)[0] or []))
                continue
            totals = [a + b for a, b in zip(totals, done)]
        return totals[0], totals[1], totals[2], totals[3]
