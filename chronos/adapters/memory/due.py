"""Which due rows a claim of the in-memory database takes (`ports.DueClaims`): the claims' rules, shared by the
claims that stamp their rows (`claims.MemoryClaims`) and the claim that deletes (`takes.MemoryTakes`), which
holds them instead."""

from __future__ import annotations

from typing import Callable

from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import StoredRow
from chronos.adapters.memory.shares import slice_of
from chronos.domain.model import Claimed, Mark
from chronos.errors import StoreRejected

_ANY_TOPIC = object()  # the claim's topic filter: none


class DueRows(MemoryHandle):
    """The claims' choice of rows (`ports.DueClaims`), whatever is done with them (`_seize`): stamped as this
    firer's (`MemoryClaims`), or held by its transaction (`takes.MemoryTakes`)."""

    def claim_share(self, slices: tuple[int, ...], limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        """`claim_whole` within these slices. See the PostgreSQL store's `claim_share`."""
        own = set(slices)
        whole: list[bool] = []

        def pick(ordered: list[StoredRow]) -> list[StoredRow]:
            return [r for r in ordered if slice_of(r) in own][:limit]
        rows = self._run(lambda now: self._claim(now, limit, lookahead_ms, _ANY_TOPIC, window_ms, pick, after, whole))
        return rows, all(whole)

    def _check_node(self) -> None:
        """A claim names its node (PostgreSQL's check constraint refuses a claimed row without one)."""
        if self.node_id is None:
            raise StoreRejected("a row cannot be claimed by a store without a node id")

    def _seize(self, now: int, rows: list[StoredRow]) -> list[Claimed]:
        """Make the rows a claim chose this firer's (at `now`): the claimed rows, in (deadline, seq) order."""
        raise NotImplementedError

    def claim(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
              after: Mark | None = None) -> list[Claimed]:
        """Claim due rows and rows due within the lookahead, in (deadline, seq) order, at most `limit`;
        with `window_ms`, only rows due at most that long ago; with `after`, only rows past its mark and,
        within the window, rows below it whose seq is past its `since_seq`."""
        return self.claim_whole(limit, lookahead_ms, window_ms, after)[0]

    def claim_whole(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        """`claim`, and whether it took every row it chose."""
        whole: list[bool] = []
        rows = self._run(lambda now: self._claim(now, limit, lookahead_ms, _ANY_TOPIC, window_ms, after=after,
                                                 whole=whole))
        return rows, all(whole)

    def last_seq(self) -> int | None:
        return self._run(lambda now: self.db.seq_last)

    def _claim(self, now: int, limit: int, lookahead_ms: int, topic: object = _ANY_TOPIC,
               window_ms: int | None = None,
               pick: Callable[[list[StoredRow]], list[StoredRow]] | None = None,
               after: Mark | None = None, whole: list[bool] | None = None) -> list[Claimed]:
        """The claim's rule (see `claim` in queries.sql): a keyed candidate is claimed only when
        every earlier row of its key (by deadline as scheduled, then seq) is a candidate of this
        same claim; a row held by a peer or still waiting holds back the later rows of its key.
        `pick` chooses the candidates from the due rows in order (default: the first `limit`); `whole` is told
        whether the claim took every candidate."""
        bound = now + lookahead_ms * 1000
        floor = None if window_ms is None else now - window_ms * 1000

        def found(r: StoredRow) -> bool:
            if after is None:
                return floor is None or r.deadline_us >= floor
            if (r.deadline_us, r.seq) > after[:2]:
                return True
            return floor is not None and r.deadline_us >= floor and after.since_seq is not None and r.seq > after.since_seq
        ordered = sorted((r for r in self.db.rows.values()
                          if r.waiting and r.deadline_us <= bound and found(r)
                          and (topic is _ANY_TOPIC or r.topic == topic)),
                         key=lambda r: (r.deadline_us, r.seq))
        candidates = ordered[:limit] if pick is None else pick(ordered)
        chosen = {r.id for r in candidates}
        keys = {r.ordering_key for r in candidates if r.ordering_key is not None}
        first_left: dict[str, tuple[int, int]] = {}  # per key, the earliest row not among the candidates
        for r in self.db.rows.values():
            if r.ordering_key in keys and r.cron is None and r.id not in chosen:
                if r.ordering_key not in first_left or r.position < first_left[r.ordering_key]:
                    first_left[r.ordering_key] = r.position
        due = [r for r in candidates
               if r.ordering_key is None or r.ordering_key not in first_left or r.position < first_left[r.ordering_key]]
        if whole is not None:
            whole.append(len(due) == len(candidates))
        if due:
            self._check_node()
        return self._seize(now, due)

    def _topics(self) -> list[str]:
        """The destination topics named by waiting rows (`waiting_topics`)."""
        return self._run(lambda now: sorted({r.topic for r in self.db.rows.values()
                                             if r.topic is not None and r.readied_us is None}))


