"""The claim that deletes on PostgreSQL (`ports.TakeStore`, CHRONOS_FIRER_CLAIM=delete): a firer's session
that takes a batch of due rows in a transaction it leaves open, and ends it once the batch is settled:
committed (`finish`, with the rows to put back or park put there first) or rolled back (`give_back`).

Each claim takes its rows in two statements (`sql/queries.sql`), after a third that reads which transactions
firers hold (`held_xids`, before the pick's snapshot is taken): a `pick`, the claim's twin, chooses them
with the claim's rules but without locking them and without the rows firers hold already; `take` deletes
those by TID in the held transaction (begun then, `begin_held`). A lock on a row lasts as long as the
transaction that took it: the claim's own FOR UPDATE would also hold the candidates its ordering check left
out, which nobody else could claim, cancel or change until the batch ends. A row another firer took since the
pick makes `take` wait, up to the session's lock_timeout: the batch rolls back (ClaimContended), and the
claimer claims again. A row changed or deleted since the pick is left out, and with it the other rows of
the batch that have an ordering key, put back at once: the order of a key is never at stake.

Nothing else runs in the transaction, so PostgreSQL, told by `held_session_settings` when the session
opens, ends it once it has been idle for the hold time: a firer that died, hangs or was cut off has its
rows back within the hold time. No statement of it is sent in a pipeline: a pipeline's flush request after
its last sync leaves PostgreSQL idle in the transaction with that timer off.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import psycopg
from psycopg.types.datetime import TimestamptzBinaryLoader

from chronos.adapters.postgres.connection import one, short
from chronos.adapters.postgres.migrations import LATEST_VERSION
from chronos.adapters.postgres.queries import PICKS, QUERIES, before_partition, due_claim
from chronos.adapters.postgres.session import LastSeq
from chronos.domain import ratelimit
from chronos.domain.model import Claimed, Mark
from chronos.errors import ClaimContended, StoreRejected, StoreUnavailable
from chronos.ports import TokenStore

log = logging.getLogger("chronos.store")

PICK_OF = {claim: pick for pick, claim in PICKS.items()}  # each claim's pick
_IDLE = psycopg.pq.TransactionStatus.IDLE
_INTRANS = psycopg.pq.TransactionStatus.INTRANS


class TakenTimes(TimestamptzBinaryLoader):
    """A take's timestamps, read in binary, each distinct one made a datetime once a statement: its rows share
    one claim time (now()) and their enqueue times come one per consumer's transaction. psycopg makes a loader
    a result, so what one remembers lasts one take."""

    def __init__(self, oid: int, context: Any = None):
        super().__init__(oid, context)
        self.made: dict[bytes, Any] = {}

    def load(self, data: Any) -> Any:
        key = bytes(data)
        made = self.made.get(key)
        if made is None:
            made = self.made[key] = super().load(data)
        return made


def taken_params(rows: Sequence[Claimed], errors: Sequence[str | None], delays: Sequence[int | None]) -> dict[str, Any]:
    """The arrays of `taken_rows` (queries.sql): the rows as taken, each with its error and delay (None: none)."""
    return {"ids": [r.id for r in rows], "deadline_us": [r.deadline_us for r in rows], "topics": [r.topic for r in rows],
            "keys": [r.key for r in rows], "values": [r.value for r in rows], "headers": [r.headers for r in rows],
            "ordering_keys": [r.ordering_key for r in rows], "enqueued_at": [r.enqueued_at for r in rows],
            "seqs": [r.seq for r in rows], "attempts": [r.attempts for r in rows], "errors": list(errors),
            "original_us": [r.original_deadline_us for r in rows], "delay_ms": list(delays),
            "input_partitions": [r.input_partition for r in rows]}


class TakeStatements(LastSeq):
    """One session of the claim that deletes: at most one batch held at a time. Not thread-safe, like any
    session: the claimer that takes a batch hands the session on to the settler that ends it."""

    _held: psycopg.Connection | None = None  # the connection whose transaction holds the batch taken

    @property
    def holding(self) -> bool:
        """Whether a batch is taken and not ended yet (as far as this session knows)."""
        return self._held is not None

    @property
    def _partitioned(self) -> bool:
        """Whether the schema records each row's input partition (version 12): this release's processes run on
        0.2.0's until `chronos migrate`, their takes and put-backs then without it."""
        return (self.schema_version if self.schema_version is not None else LATEST_VERSION) >= 12

    def _q(self, name: str) -> str:
        return QUERIES[name if self._partitioned else before_partition(name)]

    def open(self, *, check: bool = True) -> None:
        super().open(check=check)
        assert self.conn is not None
        self.conn.adapters.register_loader("timestamptz", TakenTimes)  # binary only: the take's (`_take_whole`)

    def claim(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
              after: Mark | None = None) -> list[Claimed]:
        """Take up to `limit` rows due within `lookahead_ms` (see `ClaimStatements.claim`), in this session's
        held transaction."""
        return self.claim_whole(limit, lookahead_ms, window_ms, after)[0]

    def claim_whole(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None, slices: tuple[int, ...] | None = None) -> tuple[list[Claimed], bool]:
        """`claim`, and whether it took every row it chose: its pick says how many candidates it had, and the
        take whether it found every row the pick chose. With `slices`, only rows of those."""
        name, params = due_claim(limit, lookahead_ms, window_ms, after, slices)
        found, whole = self._take_whole(PICK_OF[name], params, "take")
        rows = [Claimed(*r) for r in found]
        rows.sort(key=lambda r: (r.scheduled_us, r.seq))  # RETURNING has no order of its own
        return rows, whole

    def last_seq(self) -> int | None:
        return self._guarded_run(self._last_seq)

    def claim_share(self, slices: tuple[int, ...], limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        """`claim_whole` within these slices (chronos.domain.shares)."""
        return self.claim_whole(limit, lookahead_ms, window_ms, after, slices)

    def claim_limited(self, limits: ratelimit.FireRateLimits, output_topic: str, limit: int, lookahead_ms: int,
                      tokens: TokenStore) -> tuple[list[Claimed], bool]:
        """The claim under fire-rate limits (see `ClaimStatements.claim_limited`), topic by topic in this
        session's held transaction. A limited topic's tokens are set aside in `tokens` (a transaction of their
        own, so no firer waits on the bucket while this one holds its batch), at most as many rows as they
        allow are taken, and the tokens not used are given back."""
        topics = self._guarded_run(lambda c: [r[0] for r in self._execute(c, QUERIES["waiting_topics"], prepare=True)])

        def take(topic: str | None, share: int, lookahead: int) -> list[Claimed]:
            params = {"limit": share, "lookahead_ms": lookahead, "topic": topic}
            rows = [Claimed(*r) for r in self._take("pick_output_topic" if topic is None else "pick_topic", params,
                                                    "take")]
            rows.sort(key=lambda r: (r.scheduled_us, r.seq))
            return rows

        granted = ratelimit.claim_granted(tokens.reserve_tokens, tokens.return_tokens,
                                          lambda topic, share: take(topic, share, 0))
        return ratelimit.claim_by_topic(limits, output_topic, topics, limit,
                                        lambda topic, share: take(topic, share, lookahead_ms), granted)

    def finish(self, restore: Sequence[Claimed], retry: Sequence[tuple[Claimed, str, int]],
               park: Sequence[tuple[Claimed, str]], output_topic: str) -> None:
        """Put `restore` and `retry` back and `park` away in the held transaction, then commit it (see
        `ports.TakeStore.finish`). The session is closed when the transaction turns out to have ended, or
        its commit's outcome is unknown: its next claim opens another."""
        conn = self._held
        self._held = None
        if conn is None or conn.closed or conn is not self.conn or conn.info.transaction_status != _INTRANS:
            self.close()
            raise StoreUnavailable("the transaction that held the batch had ended (PostgreSQL ended it after the "
                                   "hold time, or the connection was lost): its rows are back")

        def run(c: psycopg.Connection) -> None:
            self._restore_rows(c, restore, retry)
            if park:
                params = taken_params([r for r, _ in park], [reason for _, reason in park], [None] * len(park))
                c.execute(QUERIES["park_taken"], {**params, "output_topic": output_topic})
            c.commit()
        try:
            self._guarded(conn, run)
        except StoreRejected as exc:  # what a pooler says of a server connection ended under it, say
            self.close()
            raise StoreUnavailable(f"the batch could not be committed ({exc}): its rows are back") from None
        except BaseException:
            self.close()  # whatever it did is rolled back with the connection, unless its commit was what failed
            raise
        self.last_ok = time.monotonic()

    def give_back(self) -> None:
        """Roll the held transaction back (see `ports.TakeStore.give_back`)."""
        conn = self._held
        self._held = None
        if conn is None or conn.closed or conn is not self.conn:
            return
        try:
            self._guarded(conn, lambda c: c.rollback())
        except (StoreUnavailable, psycopg.Error) as exc:  # the connection is closed: PostgreSQL rolls it back
            log.debug("rolling a held batch back: %s", exc)
            self.close()

    def close(self) -> None:
        self._held = None
        super().close()

    def _restore_rows(self, c: psycopg.Connection, restore: Sequence[Claimed],
                      retry: Sequence[tuple[Claimed, str, int]]) -> None:
        if restore or retry:
            rows = [*restore, *(r for r, _, _ in retry)]
            errors = [*(r.last_error for r in restore), *(e for _, e, _ in retry)]
            delays = [*(None for _ in restore), *(d for _, _, d in retry)]
            c.execute(self._q("restore_taken"), taken_params(rows, errors, delays))

    def _take(self, pick: str, params: dict[str, Any], take: str) -> list[tuple[Any, ...]]:
        """The rows `pick` chooses, deleted by `take` in this session's held transaction (begun first when none
        is open: a pick that finds nothing costs no transaction), as `take` returns them."""
        return self._take_whole(pick, params, take)[0]

    def _take_whole(self, pick: str, params: dict[str, Any], take: str) -> tuple[list[tuple[Any, ...]], bool]:
        """`_take`, and whether it took every candidate of its pick."""
        def run(c: psycopg.Connection) -> tuple[list[tuple[Any, ...]], bool]:
            held = one(self._execute(c, QUERIES["held_xids"], prepare=True))[0]  # before the pick's snapshot
            picked, ctids, candidates = one(self._execute(c, self._q(pick), {**params, "held": held}, prepare=True))
            if not picked:
                return [], not candidates
            if c.info.transaction_status == _IDLE:
                self._begin(c)
            # in binary: PostgreSQL writes no hex of a value and no text of a number, psycopg parses neither
            found = self._execute(c, self._q(take), {"ctids": ctids}, prepare=True, binary=True).fetchall()
            if len(found) < picked:
                # a row changed or deleted since the pick: the rows of the batch with an ordering key go back,
                # in case an earlier row of theirs was the one
                keyed = [r for r in found if r[11] is not None]
                log.debug("%d of %d rows picked were changed or taken meanwhile (%d with an ordering key put back)",
                          picked - len(found), picked, len(keyed))
                if keyed:  # each row as `take` returns it
                    width = 15 if self._partitioned else 14
                    self._restore_rows(c, [Claimed(*r[:width]) for r in keyed], ())
                    found = [r for r in found if r[11] is None]
            return found, len(found) == picked == candidates
        return self._guarded_run(run)

    def _begin(self, c: psycopg.Connection) -> None:
        c.execute(QUERIES["begin_held"])
        self._held = c
        if self.pooled:  # the session's settings for this transaction alone
            if self._settings is not None:
                c.execute(QUERIES["transaction_settings"], self._settings)
            c.execute(QUERIES["held_session_settings"], self.held_params(local=True))

    def _guarded_run(self, fn: Callable[[psycopg.Connection], Any]) -> Any:
        """fn(conn) on this session, in its held transaction if one is open; a statement that fails ends the
        transaction (rolled back, or closed with its connection), and with it everything taken in it: a row
        found locked by another firer's transaction raises ClaimContended, the batch given back."""
        conn = self._c()
        if self._held is not None and self._held is not conn:  # the connection it was held on is gone
            self._held = None
            raise StoreUnavailable("the transaction that held this batch had ended: its rows are back")
        try:
            result = self._guarded(conn, fn)
        except psycopg.errors.LockNotAvailable as exc:
            self.give_back()
            raise ClaimContended(f"a row picked was locked by another transaction ({short(exc, self.url)}): "
                                 "the batch is given back") from None
        except psycopg.errors.TransactionRollback as exc:
            self.give_back()
            raise StoreUnavailable(short(exc, self.url)) from None
        except BaseException:
            self.give_back()
            raise
        self.last_ok = time.monotonic()
        return result
