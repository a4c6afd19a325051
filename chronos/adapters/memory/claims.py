"""The firer's claims on the in-memory database (`ports.ClaimStore`): due rows claimed, under fire-rate
limits or not, and due occurrences of recurring schedules."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable

from chronos.adapters.memory.shares import MemoryShares, slice_of
from chronos.adapters.memory.database import Bucket, StoredRow
from chronos.domain import cron, ratelimit, schedules
from chronos.domain.model import Claimed
from chronos.domain.shares import slice_limits
from chronos.errors import StoreRejected

log = logging.getLogger("chronos.store")

_ANY_TOPIC = object()  # the claim's topic filter: none


class MemoryClaims(MemoryShares):
    """The firer's claiming side of the twin: over the firers' leases, the claim of a firer's own slices too."""

    def claim_share(self, slices: tuple[int, ...], limit: int, lookahead_ms: int,
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

    def _check_node(self) -> None:
        """A claim names its node (PostgreSQL's check constraint refuses a claimed row without one)."""
        if self.node_id is None:
            raise StoreRejected("a row cannot be claimed by a store without a node id")

    def _as_claimed(self, row: StoredRow) -> Claimed:
        assert row.readied_us is not None
        return Claimed(row.id, row.deadline_us, row.topic, row.key, row.value, row.headers,
                       cron.from_us(row.readied_us), row.seq, row.attempts, row.original_deadline_us, row.ctid)

    def claim(self, limit: int, lookahead_ms: int, window_ms: int | None = None) -> list[Claimed]:
        """Claim due rows and rows due within the lookahead, in (deadline, seq) order, at most `limit`;
        with `window_ms`, only rows due at most that long ago."""
        return self._run(lambda now: self._claim(now, limit, lookahead_ms, _ANY_TOPIC, window_ms))

    def _claim(self, now: int, limit: int, lookahead_ms: int, topic: object = _ANY_TOPIC,
               window_ms: int | None = None,
               pick: Callable[[list[StoredRow]], list[StoredRow]] | None = None) -> list[Claimed]:
        """The claim's rule (see `claim` in queries.sql): a keyed candidate is claimed only when
        every earlier row of its key (by deadline as scheduled, then seq) is a candidate of this
        same claim; a row held by a peer or still waiting holds back the later rows of its key.
        `pick` chooses the candidates from the due rows in order (default: the first `limit`)."""
        bound = now + lookahead_ms * 1000
        floor = None if window_ms is None else now - window_ms * 1000
        ordered = sorted((r for r in self.db.rows.values()
                          if r.waiting and r.deadline_us <= bound and (floor is None or r.deadline_us >= floor)
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
        if due:
            self._check_node()
        claimed = []
        for r in due:
            r.readied_us, r.readied_by, r.ctid = now, self.node_id, self.db.new_ctid()
            claimed.append(self._as_claimed(r))
        claimed.sort(key=lambda c: (c.scheduled_us, c.seq))
        return claimed

    def claim_limited(self, limits: ratelimit.FireRateLimits, output_topic: str, limit: int,
                      lookahead_ms: int) -> tuple[list[Claimed], bool]:
        """The claim under fire-rate limits, topic by topic; a limited topic's due rows (no lookahead)
        only as many as its bucket holds. See the PostgreSQL store's `claim_limited`."""
        topics = self._run(lambda now: sorted(
            {r.topic for r in self.db.rows.values() if r.topic is not None and r.readied_us is None}))
        return ratelimit.claim_by_topic(
            limits, output_topic, topics, limit,
            lambda topic, share: self._run(lambda now: self._claim(now, share, lookahead_ms, topic)),
            lambda name, topic, rate, share: self._run(lambda now: self._claim_granted(now, name, topic, rate, share)))

    def _claim_granted(self, now: int, name: str, topic: str | None, rate: float, limit: int) -> list[Claimed]:
        """Refill the topic's bucket for the time since its last refill, claim what it grants, spend it."""
        if not any(r.waiting and r.topic == topic and r.deadline_us <= now for r in self.db.rows.values()):
            return []  # nothing due: the bucket is neither made nor refilled
        capacity = ratelimit.capacity(rate)
        bucket = self.db.buckets.get(name)
        if bucket is None:
            bucket = self.db.buckets[name] = Bucket(rate, capacity, now)
        else:
            bucket.tokens = min(capacity, bucket.tokens + rate * max(0, now - bucket.refilled_us) / 1e6)
            bucket.rate, bucket.refilled_us = rate, max(bucket.refilled_us, now)
        grant = min(int(bucket.tokens), limit)
        rows = self._claim(now, grant, 0, topic) if grant > 0 else []
        bucket.tokens -= len(rows)
        return rows

    def claim_schedules(self, limit: int, lookahead_ms: int, now_us: int) -> list[Claimed]:
        """Fire due recurring schedules: each due occurrence created as a row claimed by this node,
        the schedule moved to its next occurrence (`chronos.domain.schedules.step`)."""
        def run(now: int) -> list[Claimed]:
            db = self.db
            due = sorted((r for r in db.rows.values()
                          if r.cron is not None and r.deadline_us <= now + lookahead_ms * 1000),
                         key=lambda r: r.deadline_us)[:limit]
            if due:
                self._check_node()
            claimed = []
            for s in due:
                assert s.cron is not None
                try:
                    step = schedules.step(s.id, s.deadline_us, s.cron, s.timezone, s.dst_policy, s.headers,
                                          s.last_occurrence_us, now_us)
                except cron.CronError as exc:
                    log.error("recurring schedule %s has a bad expression (%s); cancelling it", s.id, exc)
                    del db.rows[s.id]
                    continue
                occ = step.occurrence
                if occ is not None and occ.id not in db.rows:
                    db.rows[occ.id] = StoredRow(occ.id, occ.deadline_us, s.topic, s.key, s.value, occ.headers,
                                                s.ordering_key, None, None, None, db.next_seq(), db.new_ctid(), now,
                                                readied_us=now, readied_by=self.node_id)
                    claimed.append(self._as_claimed(db.rows[occ.id]))
                s.deadline_us, s.ctid = step.next_us, db.new_ctid()
                if occ is not None:
                    s.last_occurrence_us = occ.deadline_us
            return claimed
        return self._run(run)
