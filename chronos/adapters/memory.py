"""The in-memory store: a twin of the PostgreSQL store (`chronos.adapters.postgres.store.Store`)
with the same observable semantics (the roles' statements and the operators'), for unit tests of the
roles and of the operators' functions. Both pass one contract suite (tests/contract).

`MemoryDatabase` is the shared state of one database: its rows, parked messages, fire-rate buckets,
the operators' action totals and its clock (`now_us`, injected so that tests control time; PostgreSQL uses its own clock).
`MemoryStore` is a handle on it, one per thread as a PostgreSQL `Store` is one connection. Every
call runs as one statement under the database's lock, so handles in several threads behave like
connections to one database; where PostgreSQL's concurrent claims skip rows another one has
locked, here one claim simply runs after the other. Setting `MemoryDatabase.unavailable` makes
every statement fail as a lost connection does (`StoreUnavailable`), until it is cleared. There is
no planner: the waiting count `overview` gives when it would estimate is the row count's.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Callable, Iterable, Sequence, TypeVar

from chronos import codec, ports
from chronos.domain import cron, ratelimit, schedules
from chronos.domain.model import (DUE_CAP, ESTIMATE_ABOVE, Claimed, NodeLoad, Overview, Parked, Row, Stale,
                                  Throttled)
from chronos.domain.operators import (ACTIONS, PREVIEW_BYTES, Filters, Listed, Message, ParkedMessage, Position,
                                      Schedule, state_of)
from chronos.adapters.memory_shares import MemoryShares
from chronos.errors import StoreRejected, StoreUnavailable

log = logging.getLogger("chronos.store")

T = TypeVar("T")


def wall_clock_us() -> int:
    """Epoch microseconds now, by this machine's clock."""
    return time.time_ns() // 1000


class ManualClock:
    """A clock for tests: epoch microseconds that move only when `advance` is called."""

    def __init__(self, start_us: int | None = None):
        self.now_us = wall_clock_us() if start_us is None else start_us

    def __call__(self) -> int:
        return self.now_us

    def advance(self, seconds: float) -> None:
        self.now_us += round(seconds * 1_000_000)


@dataclass(slots=True)
class StoredRow:
    """One row of chronos_messages, as the twin keeps it (times in epoch microseconds)."""

    id: str
    deadline_us: int
    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: bytes
    ordering_key: str | None
    cron: str | None
    timezone: str | None
    dst_policy: str | None
    seq: int
    ctid: str                       # changes with every write, as a row version's place does in PostgreSQL
    enqueued_us: int                # when it was written (or replaced)
    readied_us: int | None = None   # claimed at (readied_at)
    readied_by: uuid.UUID | None = None
    attempts: int = 0
    last_error: str | None = None
    original_deadline_us: int | None = None
    last_occurrence_us: int | None = None

    @property
    def position(self) -> tuple[int, int]:
        """Where the row stands in its ordering key: the deadline as scheduled, then enqueue order."""
        return (self.deadline_us if self.original_deadline_us is None else self.original_deadline_us, self.seq)

    @property
    def waiting(self) -> bool:
        """Unclaimed and not a recurring schedule: what the claim and the counts of waiting rows see."""
        return self.readied_us is None and self.cron is None


@dataclass(slots=True)
class StoredParked:
    """One row of chronos_parked: a parked message, its number (the table's id) and when it was parked."""

    number: int
    parked_us: int
    message: Parked


@dataclass(slots=True)
class Bucket:
    """A destination topic's fire-rate bucket, as a row of chronos_rate_limits."""

    rate: float
    tokens: float
    refilled_us: int


class MemoryDatabase:
    """The shared state behind any number of `MemoryStore` handles: one database."""

    def __init__(self, now_us: Callable[[], int] = wall_clock_us):
        self.now_us = now_us
        self.lock = threading.Lock()
        self.rows: dict[str, StoredRow] = {}
        self.parked: list[StoredParked] = []
        self.buckets: dict[str, Bucket] = {}     # by destination topic name, as chronos_rate_limits
        self.actions: dict[str, tuple[int, int]] = {}  # action -> (times taken, messages changed): chronos_actions
        self.firers: dict[uuid.UUID, int] = {}   # node -> its lease renewed at: chronos_firers
        self.unavailable: str | None = None       # set: every statement fails with StoreUnavailable(this)
        self._seq = itertools.count(1)
        self._ctid = itertools.count(1)
        self._parked = itertools.count(1)

    def next_seq(self) -> int:
        return next(self._seq)

    def new_ctid(self) -> str:
        return f"(0,{next(self._ctid)})"

    def park(self, message: Parked, now_us: int) -> None:
        self.parked.append(StoredParked(next(self._parked), now_us, message))


_ANY_TOPIC = object()  # the claim's topic filter: none


class MemoryStore(MemoryShares):
    """A handle on a `MemoryDatabase` (a fresh one when none is given), for one thread."""

    def __init__(self, db: MemoryDatabase | None = None, *, node_id: uuid.UUID | None = None):
        self.db = db if db is not None else MemoryDatabase()
        self.node_id = node_id
        self.last_ok = 0.0
        self.link = ports.Link()

    def close(self) -> None:
        """Nothing to close: the database outlives its handles."""

    def cancel(self) -> None:
        """Nothing to cancel: a statement here never waits on I/O."""

    def _run(self, fn: Callable[[int], T]) -> T:
        """Run fn(now_us) as one statement: under the database's lock, at one time of its clock."""
        with self.db.lock:
            if self.db.unavailable is not None:
                raise StoreUnavailable(self.db.unavailable)
            result = fn(self.db.now_us())
        self.last_ok = time.monotonic()
        return result

    def _check_node(self) -> None:
        """A claim names its node (PostgreSQL's check constraint refuses a claimed row without one)."""
        if self.node_id is None:
            raise StoreRejected("a row cannot be claimed by a store without a node id")

    def _owned(self, row: StoredRow | None, claimed: Claimed) -> bool:
        """Whether this node still holds the row exactly as it claimed it (same claim time)."""
        return (row is not None and self.node_id is not None and row.readied_by == self.node_id
                and row.readied_us == cron.to_us(claimed.readied_at))

    def _held(self, claimed: Claimed) -> StoredRow | None:
        """The row as this node claimed it, if it still holds it: the same version (ctid, as
        PostgreSQL's statements reach it by TID) and the same claim."""
        row = self.db.rows.get(claimed.id)
        return row if row is not None and row.ctid == claimed.ctid and self._owned(row, claimed) else None

    def _as_claimed(self, row: StoredRow) -> Claimed:
        assert row.readied_us is not None
        return Claimed(row.id, row.deadline_us, row.topic, row.key, row.value, row.headers,
                       cron.from_us(row.readied_us), row.seq, row.attempts, row.original_deadline_us, row.ctid)

    # -- consumer --------------------------------------------------------------------------

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row],
              cancels: Sequence[str]) -> tuple[int, int, int, int]:
        """One consumer batch, all or nothing: insert new ids, insert-or-replace, cancel. Returns
        (inserted, replaced, cancelled, cancelled in flight), as the PostgreSQL store does."""
        if not (inserts or replaces or cancels):
            return 0, 0, 0, 0
        seen: set[str] = set()
        for r in replaces:
            if r.id in seen:  # PostgreSQL refuses the whole batch the same way
                raise StoreRejected(f"ON CONFLICT DO UPDATE command cannot affect row a second time (id {r.id!r})")
            seen.add(r.id)

        def run(now: int) -> tuple[int, int, int, int]:
            db = self.db
            inserted = replaced = cancelled = in_flight = 0
            for r in inserts:
                if r.id not in db.rows:
                    db.rows[r.id] = self._new_row(r, now)
                    inserted += 1
            for r in replaces:
                old = db.rows.get(r.id)
                if old is None:
                    db.rows[r.id] = self._new_row(r, now)
                else:  # the new version, waiting, with no failed publishes; seq and last occurrence kept
                    db.rows[r.id] = replace(self._new_row(r, now, seq=old.seq), last_occurrence_us=old.last_occurrence_us)
                replaced += 1
            for mid in dict.fromkeys(cancels):
                gone = db.rows.pop(mid, None)
                if gone is not None:
                    if gone.readied_us is None:
                        cancelled += 1
                    else:
                        in_flight += 1
            return inserted, replaced, cancelled, in_flight
        return self._run(run)

    def _new_row(self, r: Row, now: int, seq: int | None = None) -> StoredRow:
        return StoredRow(r.id, r.deadline_us, r.topic, r.key, r.value, r.headers, r.ordering_key, r.cron,
                         r.timezone, r.dst_policy, self.db.next_seq() if seq is None else seq, self.db.new_ctid(), now)

    def waiting_ids(self, ids: Iterable[str]) -> set[str]:
        """Which of these ids the store holds (waiting, claimed or a recurring schedule)."""
        wanted = set(ids)
        return self._run(lambda now: wanted & self.db.rows.keys()) if wanted else set()

    def park(self, messages: Sequence[Parked]) -> None:
        """Keep messages no topic accepted."""
        def run(now: int) -> None:
            for m in messages:
                self.db.park(replace(m), now)
        if messages:
            self._run(run)

    # -- firer -----------------------------------------------------------------------------

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

    def throttled(self, output_topic: str) -> list[Throttled]:
        """Per topic with a bucket refilled within the last minute: due rows not claimed, and lateness."""
        def run(now: int) -> list[Throttled]:
            found = []
            for name in sorted(self.db.buckets):
                bucket = self.db.buckets[name]
                if bucket.refilled_us <= now - 60_000_000:
                    continue
                topic = None if name == output_topic else name
                due = [r.deadline_us for r in self.db.rows.values()
                       if r.waiting and r.topic == topic and r.deadline_us <= now]
                lateness = max(0.0, (now - min(due)) / 1e6) if due else 0.0
                found.append(Throttled(name, bucket.rate, min(len(due), DUE_CAP), lateness))
            return found
        return self._run(run)

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

    def delete_fired(self, done: Sequence[Claimed]) -> int:
        """Delete exactly these rows if this node still owns them as claimed; returns how many."""
        def run(now: int) -> int:
            deleted = 0
            for c in done:
                if self._held(c) is not None:
                    del self.db.rows[c.id]
                    deleted += 1
            return deleted
        return self._run(run) if done else 0

    def release(self, rows: Sequence[Claimed]) -> int:
        """Hand claimed rows back so any firer takes them; returns how many were still this node's."""
        def run(now: int) -> int:
            released = 0
            for c in rows:
                if (row := self._held(c)) is not None:
                    row.readied_us, row.readied_by, row.ctid = None, None, self.db.new_ctid()
                    released += 1
            return released
        return self._run(run) if rows else 0

    def retry_later(self, failed: Sequence[tuple[Claimed, str, int]]) -> int:
        """Hand back rows whose publish was refused, each (row, error, delay_ms): the failure counted,
        the deadline moved by the delay, the deadline as scheduled kept."""
        def run(now: int) -> int:
            moved = 0
            for c, error, delay_ms in failed:
                if (row := self._held(c)) is not None:
                    if row.original_deadline_us is None:
                        row.original_deadline_us = row.deadline_us
                    row.deadline_us = max(row.deadline_us, now) + delay_ms * 1000
                    row.attempts += 1
                    row.last_error = error
                    row.readied_us, row.readied_by, row.ctid = None, None, self.db.new_ctid()
                    moved += 1
            return moved
        return self._run(run) if failed else 0

    def park_claimed(self, rows: Sequence[tuple[Claimed, str]], output_topic: str) -> int:
        """Move claimed rows, each (row, reason), to the parked messages; returns how many were still
        this node's."""
        def run(now: int) -> int:
            moved = 0
            for c, reason in rows:
                if (row := self._held(c)) is not None:
                    del self.db.rows[c.id]
                    self.db.park(Parked(row.id, f"store/{row.id}", row.topic or output_topic,
                                        cron.from_us(row.position[0]), row.key, row.value, row.headers, reason), now)
                    moved += 1
            return moved
        return self._run(run) if rows else 0

    def db_clock_us(self) -> int:
        return self._run(lambda now: now)

    # -- detector --------------------------------------------------------------------------

    def find_stale(self, hold_ms: int, limit: int = 10000) -> list[Stale]:
        """Rows claimed longer ago than the hold time, oldest claim first."""
        def run(now: int) -> list[Stale]:
            held = sorted((r for r in self.db.rows.values()
                           if r.readied_us is not None and r.readied_us < now - hold_ms * 1000),
                          key=lambda r: _readied(r))[:limit]
            return [Stale(r.id, cron.from_us(_readied(r)), _holder(r), r.ctid) for r in held]
        return self._run(run)

    def reset_stale(self, seen: Sequence[Stale]) -> list[uuid.UUID]:
        """Reset the rows whose claim is still what the detector saw; returns their holders."""
        def run(now: int) -> list[uuid.UUID]:
            reset = []
            for s in seen:
                row = self.db.rows.get(s.id)
                if (row is not None and row.ctid == s.ctid and row.readied_by == s.readied_by
                        and row.readied_us == cron.to_us(s.readied_at)):
                    row.readied_us, row.readied_by, row.ctid = None, None, self.db.new_ctid()
                    reset.append(s.readied_by)
            return reset
        return self._run(run) if seen else []

    # -- status ----------------------------------------------------------------------------

    def overview(self, hold_ms: int, *, exact: bool | None = None) -> Overview:
        """What `chronos status` shows; the waiting count is exact below ESTIMATE_ABOVE rows (or
        with exact=True), else the row count less the claimed rows and schedules, as PostgreSQL's
        estimate would be."""
        def run(now: int) -> Overview:
            rows = list(self.db.rows.values())
            by_node: dict[uuid.UUID, list[StoredRow]] = {}
            for r in rows:
                if r.readied_us is not None:
                    by_node.setdefault(_holder(r), []).append(r)
            nodes = [NodeLoad(node, len(held), sum(1 for r in held if _readied(r) < now - hold_ms * 1000),
                              (now - min(_readied(r) for r in held)) / 1e6,
                              cron.from_us(min(r.deadline_us for r in held)))
                     for node, held in by_node.items()]
            nodes.sort(key=lambda n: (-n.rows, n.node))
            waiting = [r.deadline_us for r in rows if r.waiting]
            later = [d for d in waiting if d > now]
            count = exact if exact is not None else len(rows) < ESTIMATE_ABOVE
            return Overview.build(cron.from_us(now), _first(waiting), _first(later), len(waiting) if count else None,
                                  len(rows), min(DUE_CAP, len(waiting) - len(later)), nodes,
                                  sum(1 for r in rows if r.cron is not None), len(self.db.parked))
        return self._run(run)


    # -- operators -------------------------------------------------------------------------

    def show(self, message_id: str, *, output_topic: str) -> Message | None:
        """The message or schedule with this id (its value's first PREVIEW_BYTES), or None."""
        def run(now: int) -> Message | None:
            r = self.db.rows.get(message_id)
            if r is None:
                return None
            return Message(id=r.id, state=_state(r), deadline=cron.from_us(r.deadline_us), topic=r.topic or output_topic,
                           key=r.key, headers=codec.decode_headers(r.headers) if r.headers else [],
                           value_size=None if r.value is None else len(r.value),
                           value_preview=b"" if r.value is None else r.value[:PREVIEW_BYTES],
                           ordering_key=r.ordering_key, enqueued_at=cron.from_us(r.enqueued_us), firer=r.readied_by,
                           claimed_at=None if r.readied_us is None else cron.from_us(r.readied_us), cron=r.cron,
                           timezone=(r.timezone or "UTC") if r.cron is not None else None, dst_policy=r.dst_policy,
                           attempts=r.attempts, last_error=r.last_error,
                           original_deadline=None if r.original_deadline_us is None
                           else cron.from_us(r.original_deadline_us))
        return self._run(run)

    def list_messages(self, f: Filters, *, output_topic: str, limit: int, after: Position | None = None,
                      not_at: datetime | None = None) -> list[Listed]:
        """Up to `limit` rows matching `f` after `after`: in (deadline, seq) order, in id order with an id
        prefix (a string's code points: the order of PostgreSQL's C collation, the embedded server's)."""
        bounds = [None if t is None else cron.to_us(t) for t in (f.due_after, f.due_before, not_at)]
        due_after, due_before, not_at_us = bounds

        def matches(r: StoredRow) -> bool:
            return ((f.state is None or _state(r) == f.state)
                    and (due_after is None or r.deadline_us > due_after)
                    and (due_before is None or r.deadline_us < due_before)
                    and (not_at_us is None or r.deadline_us != not_at_us)
                    and (f.topic is None or r.topic == f.topic) and (not f.output_topic or r.topic is None)
                    and (f.key is None or r.key == f.key)
                    and (f.ordering_key is None or r.ordering_key == f.ordering_key)
                    and (f.id_prefix is None or r.id.startswith(f.id_prefix)))

        def run(now: int) -> list[Listed]:
            found = [r for r in self.db.rows.values() if matches(r)]
            if f.id_prefix is not None:
                found = sorted((r for r in found if not isinstance(after, str) or r.id > after), key=lambda r: r.id)
            else:
                found = sorted((r for r in found if not isinstance(after, tuple) or (r.deadline_us, r.seq) > after),
                               key=lambda r: (r.deadline_us, r.seq))
            return [Listed(_state(r), r.id, cron.from_us(r.deadline_us), r.seq, r.topic or output_topic, r.key,
                           r.ordering_key, r.readied_by, r.cron) for r in found[:limit]]
        return self._run(run)

    def list_parked(self, *, limit: int, before: int | None = None) -> list[ParkedMessage]:
        """Up to `limit` parked messages numbered below `before`, newest first."""
        def shown(p: StoredParked) -> ParkedMessage:
            m = p.message
            return ParkedMessage(p.number, m.message_id, m.source, m.topic, m.deadline, m.key,
                                 codec.decode_headers(m.headers) if m.headers else [],
                                 None if m.value is None else len(m.value),
                                 b"" if m.value is None else m.value[:PREVIEW_BYTES], m.reason, cron.from_us(p.parked_us))
        return self._run(lambda now: [shown(p) for p in reversed(self.db.parked)
                                      if before is None or p.number < before][:limit])

    def list_schedules(self) -> list[Schedule]:
        """Every recurring schedule, by next occurrence (then id)."""
        def run(now: int) -> list[Schedule]:
            found = [Schedule(r.id, r.cron, r.timezone or "UTC", r.deadline_us, r.topic, r.ordering_key,
                              cron.from_us(r.enqueued_us)) for r in self.db.rows.values() if r.cron is not None]
            return sorted(found, key=lambda s: (s.next_us, s.id))
        return self._run(run)

    def present(self, ids: Sequence[str]) -> dict[str, bool]:
        """Of these ids, those held, each with whether a firer holds it."""
        return self._run(lambda now: {i: self.db.rows[i].readied_us is not None for i in ids if i in self.db.rows})

    def apply_action(self, action: str, ids: Sequence[str], at: datetime | None, *, counted: bool) -> list[str]:
        """Cancel, fire now or reschedule the rows no firer holds, and count it, all at once."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")

        def run(now: int) -> list[str]:
            db = self.db
            changed = []
            for mid in dict.fromkeys(ids):
                row = db.rows.get(mid)
                if row is None or row.readied_us is not None:
                    continue
                if action == "cancel":
                    del db.rows[mid]
                else:
                    assert at is not None  # inspect.act sets it for fire-now and reschedule
                    to = cron.to_us(at)
                    row.deadline_us, row.ctid = min(row.deadline_us, to) if action == "fire_now" else to, db.new_ctid()
                changed.append(mid)
            times, messages = db.actions.get(action, (0, 0))
            db.actions[action] = (times + (1 if counted else 0), messages + len(changed))
            return changed
        return self._run(run)

    def action_totals(self) -> dict[str, tuple[int, int]]:
        """action -> (times taken, messages changed)."""
        return self._run(lambda now: dict(sorted(self.db.actions.items())))


def _state(row: StoredRow) -> str:
    return state_of(row.cron, row.readied_us is not None)


def _readied(row: StoredRow) -> int:
    assert row.readied_us is not None
    return row.readied_us


def _holder(row: StoredRow) -> uuid.UUID:
    assert row.readied_by is not None
    return row.readied_by


def _first(deadlines: list[int]) -> datetime | None:
    return cron.from_us(min(deadlines)) if deadlines else None


# held to the ports by the type checker, as the PostgreSQL store is
_PORT: type[ports.Store] = MemoryStore
_OPERATORS_PORT: type[ports.OperatorsStore] = MemoryStore
