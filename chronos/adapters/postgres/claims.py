"""The firer's claims on PostgreSQL (`ports.ClaimStore`): due rows claimed, under fire-rate limits or not,
and due occurrences of recurring schedules. Run on the store's session (`session.Session`)."""

from __future__ import annotations

import logging

import psycopg

from chronos.adapters.postgres.queries import QUERIES, due_claim
from chronos.adapters.postgres.session import LastSeq
from chronos.adapters.postgres.shares import ShareStatements
from chronos.domain import cron, ratelimit, schedules
from chronos.domain.model import Claimed, Mark

log = logging.getLogger("chronos.store")


class ClaimStatements(ShareStatements, LastSeq):
    """The firer's claiming side of the store."""

    def claim(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
              after: Mark | None = None, slices: tuple[int, ...] | None = None) -> list[Claimed]:
        name, params = due_claim(limit, lookahead_ms, window_ms, after, slices)
        params["node"] = self.node_id
        statement = QUERIES[name]

        def run(conn: psycopg.Connection) -> list[Claimed]:
            cur = self._execute(conn, statement, params, prepare=True)
            rows = [Claimed(*r) for r in cur.fetchall()]
            rows.sort(key=lambda r: (r.scheduled_us, r.seq))  # RETURNING has no order of its own
            return rows
        return self._run(run)

    def claim_whole(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        """`claim`: its stamp returns the rows it took, not how many it chose, so it says it took them all only
        when it came back full (every row it chose)."""
        rows = self.claim(limit, lookahead_ms, window_ms, after)
        return rows, len(rows) == limit

    def claim_share(self, slices: tuple[int, ...], limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        """`claim_whole` within these slices (chronos.domain.shares)."""
        rows = self.claim(limit, lookahead_ms, window_ms, after, slices)
        return rows, len(rows) == limit

    def last_seq(self) -> int | None:
        return self._run(self._last_seq)

    def claim_limited(self, limits: ratelimit.FireRateLimits, output_topic: str, limit: int,
                      lookahead_ms: int) -> tuple[list[Claimed], bool]:
        """The claim when fire-rate limits are configured: topic by topic, each off its own index so
        a throttled backlog never delays another topic. A limited topic's rows are claimed once due
        (no lookahead: a token is spent when its message may go out) and no more of them than its
        bucket holds, taken in the claim's own transaction under the bucket's lock, so all firers
        together keep to the rate. Returns (rows in deadline order, whether a topic's share of the
        batch rather than its budget or its due rows ended its claim: a backlog to drain without
        sleeping)."""
        topics = self._run(lambda c: [r[0] for r in self._execute(c, QUERIES["waiting_topics"], prepare=True)])
        # One _run per topic: a transaction run again after a rollback repeats only its own topic.
        return ratelimit.claim_by_topic(
            limits, output_topic, topics, limit,
            lambda topic, share: self._run(lambda c: self._claim_topic(c, topic, share, lookahead_ms)),
            lambda name, topic, rate, share: self._run(lambda c: self._claim_granted(c, name, topic, rate, share)))

    def _claim_granted(self, conn: psycopg.Connection, name: str, topic: str | None, rate: float,
                       limit: int) -> list[Claimed]:
        """Claim as many due rows of one limited topic as its bucket allows, in one transaction."""
        with self._transaction(conn):
            bucket = self._execute(conn, QUERIES["take_output_tokens" if topic is None else "take_tokens"], {
                "topic": name, "rate": rate, "capacity": ratelimit.capacity(rate)}, prepare=True).fetchone()
            if bucket is None:  # nothing due
                return []
            grant = min(int(bucket[0]), limit)
            rows = self._claim_topic(conn, topic, grant, 0) if grant > 0 else []
            if rows:
                conn.execute(QUERIES["spend_tokens"], {"topic": name, "spent": len(rows)})
        return rows

    def reserve_tokens(self, name: str, topic: str | None, rate: float, limit: int) -> int:
        """`ports.TokenStore.reserve_tokens`: the bucket refilled, and up to `limit` tokens spent, in one short
        transaction of its own under the bucket's lock."""
        def run(conn: psycopg.Connection) -> int:
            with self._transaction(conn):
                bucket = self._execute(conn, QUERIES["take_output_tokens" if topic is None else "take_tokens"], {
                    "topic": name, "rate": rate, "capacity": ratelimit.capacity(rate)}, prepare=True).fetchone()
                grant = 0 if bucket is None else max(0, min(int(bucket[0]), limit))
                if grant:
                    conn.execute(QUERIES["spend_tokens"], {"topic": name, "spent": grant})
            return grant
        return self._run(run)

    def return_tokens(self, name: str, rate: float, count: int) -> None:
        """`ports.TokenStore.return_tokens`."""
        params = {"topic": name, "count": count, "capacity": ratelimit.capacity(rate)}
        self._run(lambda c: self._execute(c, QUERIES["return_tokens"], params))

    def _claim_topic(self, conn: psycopg.Connection, topic: str | None, limit: int,
                     lookahead_ms: int) -> list[Claimed]:
        query = QUERIES["claim_output_topic" if topic is None else "claim_topic"]
        params = {"node": self.node_id, "limit": limit, "lookahead_ms": lookahead_ms, "topic": topic}
        return [Claimed(*r) for r in self._execute(conn, query, params, prepare=True).fetchall()]

    def claim_schedules(self, limit: int, lookahead_ms: int, now_us: int) -> list[Claimed]:
        """Fire due recurring schedules: in one transaction per call, create each due occurrence
        as a row claimed by this node and move the schedule to its next occurrence, so that with
        several firers, restarts and kills no occurrence is skipped or created twice.

        A schedule replaced after its occurrence was created (within the lookahead) is due again
        at that same time: that occurrence is not created again (the old version's stays the
        only one), the replacement applies from the next occurrence after it."""
        def run(conn: psycopg.Connection) -> list[Claimed]:
            claimed: list[Claimed] = []
            with self._transaction(conn):
                due = conn.execute(QUERIES["due_schedules"], {"limit": limit, "lookahead_ms": lookahead_ms})
                for (sid, deadline_us, expr, tz, topic, key, value, headers, okey, last_us, dst) in due.fetchall():
                    try:
                        step = schedules.step(sid, deadline_us, expr, tz, dst, headers, last_us, now_us)
                    except cron.CronError as exc:
                        log.error("recurring schedule %s has a bad expression (%s); cancelling it", sid, exc)
                        conn.execute(QUERIES["cancel"], {"ids": [sid]})
                        continue
                    occ = step.occurrence
                    if occ is not None:
                        row = conn.execute(QUERIES["insert_occurrence"], {
                            "id": occ.id, "deadline_us": occ.deadline_us, "topic": topic, "key": key,
                            "value": value, "headers": occ.headers, "ordering_key": okey,
                            "node": self.node_id}).fetchone()
                        if row is not None:
                            claimed.append(Claimed(*row))
                    conn.execute(QUERIES["advance_schedule"], {"id": sid, "next_us": step.next_us,
                                                               "last_us": occ.deadline_us if occ else None})
            return claimed
        return self._run(run)
