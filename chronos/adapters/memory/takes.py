"""The claim that deletes on the in-memory database (`ports.TakeStore`), as `chronos.adapters.postgres.takes`
has it: a handle whose claims hold the rows they take in its transaction (`database.Taken`) instead of
stamping them, until `finish` (they go, with those to put back or park put there) or `give_back` (they are
back). Held rows stay in the table, in flight to every other handle, as PostgreSQL shows a row whose delete
is not committed yet; a write of the same id happens at once, as it would once the firer's transaction
ended (it never waits here). `end` is what PostgreSQL does to a session idle in its transaction for the
hold time."""

from __future__ import annotations

import uuid
from typing import Sequence

from chronos.adapters.memory.due import DueRows
from chronos.adapters.memory.database import MemoryDatabase, StoredRow, Taken
from chronos.domain import cron, ratelimit
from chronos.domain.model import Claimed, Parked
from chronos.errors import StoreUnavailable
from chronos.ports import TokenStore


class MemoryTakes(DueRows):
    """One session of the claim that deletes: at most one batch held at a time."""

    def __init__(self, db: MemoryDatabase | None = None, *, node_id: uuid.UUID | None = None):
        super().__init__(db, node_id=node_id)
        self.hold: Taken | None = None     # the open transaction
        self.taken: list[StoredRow] = []   # the rows it holds

    @property
    def holding(self) -> bool:
        return self.hold is not None

    def _seize(self, now: int, rows: list[StoredRow]) -> list[Claimed]:
        """Hold the rows in this session's transaction, begun now if none is open."""
        if self.hold is None or self.hold.ended:
            assert self.node_id is not None
            self.hold, self.taken = Taken(self.node_id, now), []
        hold = self.hold
        claimed = []
        for r in rows:
            r.held_by = hold
            self.taken.append(r)
            claimed.append(Claimed(r.id, r.deadline_us, r.topic, r.key, r.value, r.headers, cron.from_us(hold.since_us),
                                   r.seq, r.attempts, r.original_deadline_us, r.ctid, r.ordering_key,
                                   cron.from_us(r.enqueued_us), r.last_error, r.input_partition))
        claimed.sort(key=lambda c: (c.scheduled_us, c.seq))
        return claimed

    def claim_limited(self, limits: ratelimit.FireRateLimits, output_topic: str, limit: int, lookahead_ms: int,
                      tokens: TokenStore) -> tuple[list[Claimed], bool]:
        """The claim under fire-rate limits, each limited topic's tokens set aside in `tokens` first (see the
        PostgreSQL session's `claim_limited`)."""
        def take(topic: str | None, share: int, lookahead: int) -> list[Claimed]:
            return self._run(lambda now: self._claim(now, share, lookahead, topic))

        granted = ratelimit.claim_granted(tokens.reserve_tokens, tokens.return_tokens,
                                          lambda topic, share: take(topic, share, 0))
        return ratelimit.claim_by_topic(limits, output_topic, self._topics(), limit,
                                        lambda topic, share: take(topic, share, lookahead_ms), granted)

    def finish(self, restore: Sequence[Claimed], retry: Sequence[tuple[Claimed, str, int]],
               park: Sequence[tuple[Claimed, str]], output_topic: str) -> None:
        """Commit: the rows taken go (those replaced meanwhile are the replacement's), those to restore or
        retry come back (unless their id was written again meanwhile), those to park are parked."""
        def run(now: int) -> None:
            hold, self.hold = self.hold, None
            if hold is None or hold.ended:
                raise StoreUnavailable("the transaction that held the batch had ended: its rows are back")
            db = self.db
            for row in self.taken:
                if db.rows.get(row.id) is row:
                    del db.rows[row.id]
            for c, error, delay_ms in [*((c, c.last_error, None) for c in restore), *retry]:
                if c.id in db.rows:
                    continue
                deadline, original = c.deadline_us, c.original_deadline_us
                if delay_ms is not None:
                    original = deadline if original is None else original
                    deadline = max(deadline, now) + delay_ms * 1000
                assert c.enqueued_at is not None, "a row taken by the claim that deletes carries its enqueue time"
                db.rows[c.id] = StoredRow(c.id, deadline, c.topic, c.key, c.value, c.headers or b"", c.ordering_key,
                                          None, None, None, c.seq, db.new_ctid(), cron.to_us(c.enqueued_at),
                                          attempts=c.attempts + (delay_ms is not None), last_error=error,
                                          original_deadline_us=original, input_partition=c.input_partition,
                                          frozen=c.input_partition in db.frozen)
            for c, reason in park:
                db.park(Parked(c.id, f"store/{c.id}", c.topic or output_topic, cron.from_us(c.scheduled_us), c.key,
                               c.value, c.headers or b"", reason), now)
            self.taken = []
        self._run(run)

    def give_back(self) -> None:
        """Roll back: every row taken is back as it was."""
        with self.db.lock:
            self._roll_back()

    def end(self) -> None:
        """What PostgreSQL does to a session idle in its transaction for the hold time: the transaction rolled
        back, and this session's `finish` fails."""
        with self.db.lock:
            hold = self.hold
            self._roll_back()
            if hold is not None:
                hold.ended, self.hold = True, hold

    def _roll_back(self) -> None:
        hold, self.hold = self.hold, None
        for row in self.taken:
            if row.held_by is hold:
                row.held_by = None
        self.taken = []
