"""The claimer: the firer's thread that claims rows and hands them to the sender."""

from __future__ import annotations

import logging
import random
import time
from typing import Callable

from chronos.config import Settings
from chronos.domain.model import Claimed
from chronos.domain.ratelimit import CellLimits
from chronos.domain.shares import Shares, claimer_slices, overdue_ms, strays_every
from chronos.errors import StoreRejected, StoreUnavailable
from chronos.telemetry.metrics import FirerTelemetry
from chronos.ports import ClaimStore, DueClaims, TakeStore
from chronos.roles.firer.batches import HeldBatches
from chronos.roles.firer.claiming import CLAIM_AGAIN_SOON, RECENT_WINDOW_MS, ClaimThread
from chronos.roles.firer.decisions import ClaimCursor
from chronos.roles.firer.handoff import Claims, Shared
from chronos.runtime.process import Lifecycle

log = logging.getLogger("chronos.firer")

SEQ_READ_EVERY = 0.5     # seconds: how often the claimer reads the messages' last seq (ClaimCursor.seq_read)
WINDOW_CLAIM_EVERY = 0.2  # seconds: between claims that start where the last ended, one of the window (ClaimCursor)
KAFKA_PROBE_EVERY = 1.0  # seconds: after a stall, how often the claimer asks Kafka whether it answers
SHARE_EVERY_S = 5.0  # with cells and fire-rate limits: how often the cell's share of them is worked out again


class Claimer(ClaimThread):
    """The claimer: claims due rows (within each rate-limited topic's budget) and recurring
    schedules' occurrences, and hands them to the sender through `outbox`. It paces itself:
    at once again while a claim comes back full (a backlog), otherwise after the poll interval;
    it claims nothing while Kafka keeps publishes waiting (back-pressure) nor beyond `max_held`
    rows held. On a thread and connection of its own, apart from the settler: a claim that runs
    long (a lock, a plan gone bad) stops only further claims, and the rows already held keep being
    deleted once published, so none of them ages past the hold time into a peer's hands. With other
    firers live it claims from its own share of the due rows (`shares`), then what others left overdue.

    A firer runs `parts` claimers (CHRONOS_FIRER_CLAIMERS), so that its next claim is on its way while
    the last one's rows are handed on and published: the `part`-th claims its own part of the firer's
    slices (`claimer_slices`), on a connection of its own. The first (`lead` None) also renews the
    firer's lease, asks Kafka whether it answers after a stall, claims recurring schedules and the
    others' overdue rows (other firers', and this firer's other claimers'); the others (`lead`: the
    first) follow its view of the shares. They share the firer's cap on held rows (`Shared.reserve`).

    With the claim that deletes (`batches`: CHRONOS_FIRER_CLAIM=delete), each claim of due rows runs on a
    free session of the firer's (`HeldBatches`), whose transaction then holds its rows as one batch until the
    settler ends it; with none free (as many batches in flight as MAX_HELD_BATCHES), it claims nothing until
    one is. Its own connection still renews the lease, sets fire-rate tokens aside and claims the recurring
    schedules' occurrences, which are stamped as claimed either way."""

    def __init__(self, store: ClaimStore, settings: Settings, shared: Shared, telemetry: FirerTelemetry, life: Lifecycle,
                 outbox: Claims, kafka_answers: Callable[[], bool] = lambda: True, *,
                 part: int = 0, parts: int = 1, lead: Claimer | None = None, batches: HeldBatches | None = None,
                 cell_share: Callable[[], float | None] | None = None):
        """`kafka_answers` asks Kafka for its metadata (blocking up to a second or so): whether it answered.
        `cell_share` (cells) says this cell's share of the fire-rate limits, asked every SHARE_EVERY_S."""
        super().__init__("claimer" if part == 0 else f"claimer{part + 1}", store, settings, shared, telemetry, life,
                         outbox, batches)
        self.part, self.parts, self.lead, self.kafka_answers = part, parts, lead, kafka_answers
        self.kafka_answered_at = 0.0  # monotonic: Kafka last answered the claimer's own request
        self.next_kafka_probe = 0.0   # monotonic
        self.limits = CellLimits(settings.fire_rates, cell_share if settings.fire_rates else None, SHARE_EVERY_S)
        if settings.fire_rates:
            log.info("fire-rate limits: %s", settings.fire_rates)
        self.claims_paused = False
        self.next_claim = 0.0
        self.next_schedules = 0.0
        self.next_full_claim = self.next_seq_read = 0.0  # monotonic
        self.next_strays = 0.0      # monotonic: the next claim of any slice's rows overdue by the hold time
        self.cursor = ClaimCursor(WINDOW_CLAIM_EVERY)  # where this claimer's next claim of recent rows starts
        self.swept = False  # a sweeper of its own (sweeper.Sweeper) runs its full claims, bounded by its mark:
        self.swept_from: tuple[tuple[int, ...] | None, tuple[int, int] | None] | None = None  # its slices and mark
        if lead is not None:  # one lease per firer: the first claimer's
            self.shares: Shares | None = lead.shares
        else:
            self.shares = Shares(store.node_id, settings.hold_time_ms) if store.node_id is not None else None

    def loop(self) -> None:
        try:
            super().loop()
        finally:
            self.leave()

    def pass_once(self) -> float:
        self.claim(time.time())
        return self.next_claim - time.time()

    def leave(self) -> None:
        """Give this firer's share up (the first claimer, which renews the lease): the others take it at once."""
        if self.lead is not None or self.shares is None or self.shares.next_renewal == 0.0:  # never took one
            return
        if not self.shares.leases:  # a schema without leases: nothing to give up
            return
        try:
            self.store.firer_leave()
        except StoreUnavailable as exc:
            log.warning("could not give this firer's share up (%s): the others take it after the hold time", exc)

    def kafka_answers_now(self) -> bool:
        """Ask Kafka for its metadata, at most once a second: whether it answered."""
        mono = time.monotonic()
        if mono < self.next_kafka_probe:
            return False
        self.next_kafka_probe = mono + KAFKA_PROBE_EVERY
        if not self.kafka_answers():
            return False
        self.kafka_answered_at = time.monotonic()
        return True

    def stop(self) -> None:
        super().stop()
        self.store.cancel()  # the claimer's own statements too (the lease, the recurring schedules)

    def claim(self, now: float) -> None:
        """Claim what is due now (wall-clock `now`), unless Kafka lags or enough rows are held, and
        set `next_claim`."""
        # Kafka does not acknowledge, or acknowledges so slowly that publishes wait for seconds (an
        # overloaded broker): rows claimed now would only wait, be handed to a peer after the hold time
        # and be published again by it, over and over; claim nothing until Kafka catches up
        stalled = self.shared.stalled(time.monotonic())
        if stalled > self.settings.hold_time_ms / 2000.0:
            if not self.claims_paused:
                self.claims_paused = True
                self.warn("a publish has waited %.1fs for Kafka's acknowledgement: claiming nothing until "
                          "Kafka catches up", stalled)
            self.next_claim = now + 0.05
            return
        # the producer was replaced because nothing was acknowledged for the stall time, and nothing
        # was since: the publishes in flight were purged, so none waits, yet Kafka may be as far away as
        # before (this host cut off from it). Rows claimed now would wait out the hold time again and
        # go to a peer, each time; claim again only once Kafka answers a request of the claimer's own
        # (the first claimer asks; the others wait for its answer).
        stall_at = self.shared.kafka_stall_at
        if stall_at is not None and (self.lead or self).kafka_answered_at < stall_at:
            if self.lead is not None or not self.kafka_answers_now():
                self.claims_paused = True
                self.next_claim = now + 0.05
                return
            self.claims_paused = False
            log.warning("Kafka answers again: claiming rows")
        elif self.claims_paused:
            self.claims_paused = False
            self.warn("Kafka acknowledges again: claiming rows")
        if time.monotonic() < self.shared.claims_resume_at:  # the producer is being replaced: rows would bounce
            self.next_claim = now + 0.05
            return
        claimed = self.claim_batch(self.take)
        if claimed is None:  # nothing could be claimed now (the cap reached, a row contended)
            self.next_claim = now + CLAIM_AGAIN_SOON
            return
        rows, backlog, started, room = claimed
        occurrences = []
        # recurring schedules: by the first claimer, once per poll interval, even in a backlog
        if self.lead is None and now >= self.next_schedules:
            self.next_schedules = now + self.settings.poll_interval_ms / 1000.0
            sent = time.monotonic()
            occurrences = self.store.claim_schedules(room, self.settings.lookahead_ms, time.time_ns() // 1000)
            self.hand_to_sender(sent, occurrences)
        self.measured("claim", len(rows) + len(occurrences), started)
        if backlog:
            self.next_claim = now  # a backlog: drain it without sleeping
        else:
            interval = self.settings.poll_interval_ms / 1000.0
            self.next_claim = now + interval * random.uniform(0.9, 1.1)

    def take(self, session: TakeStore | None, limit: int) -> tuple[list[Claimed], bool]:
        """The claim proper (`ClaimThread.claim_batch`): on `session` (the claim that deletes) or the claimer's
        store, up to `limit` rows."""
        limits = self.limits.current(time.monotonic())  # with cells, this cell's share, whichever the claim
        if limits and session is not None:  # fire-rate limits, the tokens set aside on the claimer's store
            return session.claim_limited(limits, self.settings.output_topic, limit, self.settings.lookahead_ms,
                                         self.store)
        if limits:  # fire-rate limits: topic by topic, within each limited topic's budget
            return self.store.claim_limited(limits, self.settings.output_topic, limit, self.settings.lookahead_ms)
        return self.claim_rows(limit, self.store if session is None else session)

    def claim_rows(self, limit: int, claims: DueClaims) -> tuple[list[Claimed], bool]:
        """The claim without fire-rate limits: (the rows, whether they are a backlog's, to drain without
        sleeping). Most claims take only rows due at most RECENT_WINDOW_MS ago: the due index keeps an entry
        for every row claimed since its last vacuum, all at the head of its range, and a claim that starts there
        walks them all; a claim starts where the last one ended (`ClaimCursor`). Older rows (written late, handed
        back, a backlog) wait for a full claim, every FULL_CLAIM_EVERY or at once again (`full_claim_again`): its
        own, or with a sweeper (`swept`) the sweeper's, below the mark the claimer's last claim left (`swept_from`).

        With other firers live, the claim takes this firer's own slices; one every SEQ_READ_EVERY that finds them
        drained also takes what others left overdue (`take_others`): a quiet firer's rows, and any slice's once
        overdue by the hold time. With other claimers in this firer, each claims its part of the firer's slices,
        and the first takes the others' overdue rows too. `claims`: the store's, or a session of the claim that
        deletes."""
        now = time.monotonic()
        full = not self.swept and now >= self.next_full_claim
        beat = full or now >= self.next_seq_read  # the last seq read again, and the others' overdue rows taken
        mine = self.own_slices(now)
        window = None if full else RECENT_WINDOW_MS
        rows: list[Claimed] = []
        self.cursor.within(mine)
        if mine is None or mine:  # none: every slice; empty: fewer slices than claimers, or no lease yet
            if beat:
                self.cursor.seq_read(claims.last_seq())
                self.next_seq_read = now + SEQ_READ_EVERY
            mark = self.cursor.start(now, full)
            rows, whole = (claims.claim_whole(limit, self.settings.lookahead_ms, window, mark) if mine is None
                           else claims.claim_share(mine, limit, self.settings.lookahead_ms, window, mark))
            self.cursor.ended(((r.deadline_us, r.seq) for r in rows), whole, len(rows) == limit)
        self.swept_from = (mine, self.cursor.after)
        backlog = len(rows) == limit
        if mine:
            assert self.shares is not None
            if self.lead is None and self.shares.takes_others(beat, backlog, self.parts) and len(rows) < limit:
                taken = self.take_others(self.shares, limit - len(rows), claims)
                backlog = len(rows) + len(taken) == limit
                rows += taken
        if full:
            self.next_full_claim = self.next_full_claim_at(rows, backlog, now)
        return rows, backlog

    def take_others(self, shares: Shares, limit: int, claims: DueClaims) -> list[Claimed]:
        """Up to `limit` rows others left overdue: of the quiet firers' slices and this firer's other
        claimers' (`Shares.taken_slices`) once overdue by `overdue_ms`, then of any slice once overdue by
        the hold time (an owner that renews its lease yet serves nothing). The last claim starts at the
        head of the due index, where every row claimed since its last vacuum left an entry: it runs at
        most every `strays_every` (a quarter of the hold time), not at every full pass, unless it last
        came back full."""
        taken: list[Claimed] = []
        slices = shares.taken_slices(self.parts)
        if slices:
            taken, _ = claims.claim_share(slices, limit, -overdue_ms(self.settings.poll_interval_ms))  # no mark: all
        now = time.monotonic()
        if len(taken) < limit and now >= self.next_strays:
            strays = claims.claim(limit - len(taken), -self.settings.hold_time_ms)
            full = len(strays) == limit - len(taken)
            self.next_strays = now if full else now + strays_every(self.settings.hold_time_ms)
            taken += strays
        return taken

    def own_slices(self, now: float) -> tuple[int, ...] | None:
        """This claimer's slices (None: every slice, it claims alone for a firer alone): its part of the
        firer's, whose lease the first claimer renews first when due (`now` monotonic)."""
        shares = self.shares
        if shares is not None and self.lead is None and shares.renewal_due(now):
            renew(self.store, shares, self.settings.hold_time_ms, now)
        firers = None if shares is None else shares.mine
        if self.parts == 1:
            return firers
        if shares is not None and not shares.leases:  # no slices to divide: the first claims every row
            return None if self.lead is None else ()
        if shares is not None and shares.next_renewal == 0.0:  # the lease not taken yet: whose slices is unknown
            return ()
        return claimer_slices(firers, self.part, self.parts)

    def warn(self, message: str, *args: object) -> None:
        """A warning of what all the firer's claimers see alike (Kafka's stalls): the first one's only."""
        if self.lead is None:
            log.warning(message, *args)


def renew(store: ClaimStore, shares: Shares, hold_time_ms: int, now: float) -> None:
    """Renew the firer's lease; on a schema without leases (not yet migrated to version 9, refused as
    StoreRejected), claim from every slice, as a firer alone, and look for them again later."""
    try:
        others = store.firer_heartbeat(hold_time_ms)
    except StoreRejected as exc:
        if shares.leases:
            log.warning("the firers cannot divide the due rows (%s): this firer claims from all of them "
                        "until `chronos migrate` brings the schema to version 9", exc)
        shares.without_leases(now)
        return
    had_none = not shares.leases
    if shares.renewed(others, now) or had_none:
        log.info("%d firers share the due rows: this one claims first from slices %s", shares.firers,
                 "all" if shares.mine is None else ",".join(map(str, shares.mine)))
