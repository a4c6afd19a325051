"""The firer's claims on the in-memory database (`ports.ClaimStore`): due rows claimed (which ones:
`due.DueRows`), under fire-rate limits or not, and due occurrences of recurring schedules."""

from __future__ import annotations

import logging

from chronos.adapters.memory.due import DueRows
from chronos.adapters.memory.shares import MemoryShares
from chronos.adapters.memory.database import Bucket, StoredRow
from chronos.domain import cron, ratelimit, schedules
from chronos.domain.model import Claimed

log = logging.getLogger("chronos.store")


class MemoryClaims(DueRows, MemoryShares):
    """The firer's claiming side of the twin: over the firers' leases, the claim of a firer's own slices too."""

    def _as_claimed(self, row: StoredRow) -> Claimed:
        assert row.readied_us is not None
        return Claimed(row.id, row.deadline_us, row.topic, row.key, row.value, row.headers,
                       cron.from_us(row.readied_us), row.seq, row.attempts, row.original_deadline_us, row.ctid)

    def _seize(self, now: int, rows: list[StoredRow]) -> list[Claimed]:
        """Stamp the rows as this firer's, claimed now."""
        claimed = []
        for r in rows:
            r.readied_us, r.readied_by, r.ctid = now, self.node_id, self.db.new_ctid()
            claimed.append(self._as_claimed(r))
        claimed.sort(key=lambda c: (c.scheduled_us, c.seq))
        return claimed

    def claim_limited(self, limits: ratelimit.FireRateLimits, output_topic: str, limit: int,
                      lookahead_ms: int) -> tuple[list[Claimed], bool]:
        """The claim under fire-rate limits, topic by topic; a limited topic's due rows (no lookahead)
        only as many as its bucket holds. See the PostgreSQL store's `claim_limited`."""
        topics = self._topics()
        return ratelimit.claim_by_topic(
            limits, output_topic, topics, limit,
            lambda topic, share: self._run(lambda now: self._claim(now, share, lookahead_ms, topic)),
            lambda name, topic, rate, share: self._run(lambda now: self._claim_granted(now, name, topic, rate, share)))

    def _claim_granted(self, now: int, name: str, topic: str | None, rate: float, limit: int) -> list[Claimed]:
        """Refill the topic's bucket for the time since its last refill, claim what it grants, spend it."""
        bucket = self._refilled(now, name, topic, rate)
        if bucket is None:
            return []
        grant = min(int(bucket.tokens), limit)
        rows = self._claim(now, grant, 0, topic) if grant > 0 else []
        bucket.tokens -= len(rows)
        return rows

    def _refilled(self, now: int, name: str, topic: str | None, rate: float) -> Bucket | None:
        """The topic's bucket refilled for the time since its last refill; None (neither made nor refilled)
        while none of its rows is due. Rows held by a claim that deletes count, as PostgreSQL sees them."""
        if not any(r.readied_us is None and r.cron is None and r.topic == topic and r.deadline_us <= now
                   for r in self.db.rows.values()):
            return None
        capacity = ratelimit.capacity(rate)
        bucket = self.db.buckets.get(name)
        if bucket is None:
            bucket = self.db.buckets[name] = Bucket(rate, capacity, now)
        else:
            bucket.tokens = min(capacity, bucket.tokens + rate * max(0, now - bucket.refilled_us) / 1e6)
            bucket.rate, bucket.refilled_us = rate, max(bucket.refilled_us, now)
        return bucket

    def reserve_tokens(self, name: str, topic: str | None, rate: float, limit: int) -> int:
        """`ports.TokenStore.reserve_tokens`."""
        def run(now: int) -> int:
            bucket = self._refilled(now, name, topic, rate)
            grant = 0 if bucket is None else max(0, min(int(bucket.tokens), limit))
            if bucket is not None:
                bucket.tokens -= grant
            return grant
        return self._run(run)

    def return_tokens(self, name: str, rate: float, count: int) -> None:
        """`ports.TokenStore.return_tokens`."""
        def run(now: int) -> None:
            bucket = self.db.buckets.get(name)
            if bucket is not None:
                bucket.tokens = min(bucket.tokens + count, ratelimit.capacity(rate))
        self._run(run)

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
