"""The firer's settling statements on PostgreSQL (`ports.SettleStore`): claimed rows deleted once published,
handed back, retried later or parked, each only while this node still holds them as it claimed them. Run
on the store's session (`session.Session`)."""

from __future__ import annotations

from typing import Sequence

from chronos.adapters.postgres.arrays import claimed_params
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session
from chronos.domain.model import Claimed


class SettleStatements(Session):
    """The firer's settling side of the store."""

    def delete_fired(self, done: Sequence[Claimed]) -> int:
        """Delete exactly these rows if this node still owns them as claimed; returns how many."""
        if not done:
            return 0
        params = claimed_params(done, self.node_id)
        return self._run(lambda c: self._execute(c, QUERIES["delete_fired"], params, prepare=True).rowcount)

    def release(self, rows: Sequence[Claimed]) -> int:
        """Hand claimed rows back (unpublished, or their publish failed) so any firer takes them."""
        if not rows:
            return 0
        params = claimed_params(rows, self.node_id)
        return self._run(lambda c: self._execute(c, QUERIES["release"], params).rowcount)

    def retry_later(self, failed: Sequence[tuple[Claimed, str, int]]) -> int:
        """Hand back rows whose publish was refused, each (row, error, delay_ms): the failure is
        counted and the row waits out its delay before any firer claims it again. Returns how many
        rows were still this node's."""
        if not failed:
            return 0
        params = claimed_params([r for r, _, _ in failed], self.node_id)
        params.update(errors=[e for _, e, _ in failed], delay_ms=[d for _, _, d in failed])
        return self._run(lambda c: self._execute(c, QUERIES["retry_later"], params).rowcount)

    def park_claimed(self, rows: Sequence[tuple[Claimed, str]], output_topic: str) -> int:
        """Move claimed rows, each (row, reason), from the store to chronos_parked in one statement.
        Returns how many were still this node's (and so moved)."""
        if not rows:
            return 0
        params = claimed_params([r for r, _ in rows], self.node_id)
        params.update(reasons=[reason for _, reason in rows], output_topic=output_topic)
        return self._run(lambda c: self._execute(c, QUERIES["park_claimed"], params).rowcount)
