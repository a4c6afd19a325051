"""The sweeper: a claimer's thread that takes the due rows its claims pass over, off the claims' path."""

from __future__ import annotations

import threading
import time

from chronos.domain.model import Claimed
from chronos.errors import ClaimContended, StoreUnavailable
from chronos.ports import ClaimStore, TakeStore
from chronos.roles.firer.batches import HeldBatches
from chronos.roles.firer.claimer import FULL_CLAIM_EVERY, RECENT_WINDOW_MS, Claimer
from chronos.roles.firer.decisions import full_claim_again
from chronos.roles.firer.store_thread import StoreThread

SWEEP_MARGIN_MS = 50  # the sweep's bound lies this far below the claimer's mark (clock offsets, the statement's start)
IDLE_WAIT = 0.05      # seconds: how soon a sweeper that could not sweep (nothing claimed yet, claims paused) looks again


class Sweeper(StoreThread[ClaimStore]):
    """A claimer's full claims, on a thread of their own (the claim that deletes, without fire-rate limits).

    A claimer's claims start where its last one ended (`ClaimCursor`): the rows below that mark it looks at again
    only if they were written since its last seq reads. The others below it (handed back, rolled back with a
    batch, written by a long transaction, due long ago) are the full claim's, every FULL_CLAIM_EVERY, which walks
    the due index from its head: past every row taken since the last full claim, whose entries the index still
    holds. Under load that walk is long (at 40,000 msg/s a quarter of a second and more), and a claimer that ran
    it itself claimed nothing meanwhile: the rows falling due then went out late. The sweeper runs it instead, on
    a session of the firer's (`HeldBatches`), bounded by the claimer's mark as its last claim left it
    (`Claimer.swept_from`; SWEEP_MARGIN_MS below it): its claim and the claimer's claims past the mark meet no row
    of each other's, and the claimer never waits for it. Where the claimer has no mark (its last claim was one
    of the window, or left rows behind) the bound is the window's start, below which the claimer's claims do
    not look. A sweep is followed by another at once when it took rows due long ago or came back full
    (`full_claim_again`), as the claimer's full claims were. Its rows go to the sender with the claimer's."""

    def __init__(self, claimer: Claimer, store: ClaimStore, batches: HeldBatches):
        """`store` is the thread's own, which it opens only to close it (its claims run on `batches`' sessions)."""
        name = "sweeper" if claimer.part == 0 else f"sweeper{claimer.part + 1}"
        super().__init__(name, store, claimer.settings, claimer.shared, claimer.metrics, claimer.life)
        self.claimer, self.batches = claimer, batches
        self.stopped = threading.Event()
        self.sweeping: TakeStore | None = None  # the session of the sweep running now
        self.next_sweep = 0.0  # monotonic
        self.last_ok = 0.0     # monotonic: PostgreSQL last answered a sweep
        claimer.swept = True

    def loop(self) -> None:
        while not self.stopped.is_set():
            try:
                asked = time.monotonic()
                wait = self.sweep(asked)
                if self.last_ok >= asked:
                    self.outage.ok()
            except StoreUnavailable as exc:
                if self.stopped.is_set():  # the sweep cancelled by stop()
                    return
                wait = self.outage.failed(exc)
            self.stopped.wait(max(0.0, wait))

    def stop(self) -> None:
        """Stop sweeping: a sweep running now is cancelled (and rolls back, holding nothing)."""
        self.stopped.set()
        session = self.sweeping
        if session is not None:
            session.cancel()

    def bound_ms(self, mark: tuple[int, int] | None) -> int:
        """The sweep's bound on deadlines, from now in milliseconds (the claim's lookahead): SWEEP_MARGIN_MS below
        the claimer's `mark` ((deadline in µs, seq), database time), never past the lookahead; without a mark the
        start of the claimer's window."""
        if mark is None:
            return -RECENT_WINDOW_MS
        db_now_us = time.time_ns() // 1000 + self.shared.timing.offset_us
        return min(self.settings.lookahead_ms, (mark[0] - db_now_us) // 1000 - SWEEP_MARGIN_MS)

    def sweep(self, now: float) -> float:
        """Sweep when due (`now` monotonic), unless the claimer is holding off or the firer holds all it may:
        how long to wait before the next look."""
        claimer = self.claimer
        if claimer.swept_from is None or claimer.claims_paused or now < self.shared.claims_resume_at:
            return IDLE_WAIT
        if now < self.next_sweep:
            return self.next_sweep - now
        slices, mark = claimer.swept_from
        if slices == ():  # the claimer claims nothing now (no slices of its own yet)
            return IDLE_WAIT
        limit = self.shared.reserve(claimer.limit, claimer.max_held, claimer.max_held_bytes)
        session = self.batches.session() if limit else None
        if session is None:  # as much held as the firer may, or every session holds a batch
            self.shared.count_claimed([], reserved=limit)
            return 0.005
        rows: list[Claimed] = []
        self.sweeping = session
        try:
            started, sent = time.perf_counter(), time.monotonic()
            bound = self.bound_ms(mark)
            rows, _ = (session.claim_whole(limit, bound) if slices is None
                       else session.claim_share(slices, limit, bound))
            self.last_ok = time.monotonic()
        except ClaimContended as exc:  # a row taken by the claimer since it was chosen: sweep again soon
            self.shared.count_claimed([], reserved=limit)
            claimer.release_session(session)
            self.throttle.warning("contended", "%s", exc)
            return 0.005
        except BaseException as exc:  # a sweep that failed or was cancelled holds nothing
            self.shared.count_claimed([], reserved=limit)
            claimer.release_session(session)
            if isinstance(exc, StoreUnavailable):
                self.batches.drop_idle()
            raise
        finally:
            self.sweeping = None
        if rows:
            self.batches.hold(session, rows)
        else:
            claimer.release_session(session)
        claimer.hand_to_sender(sent, rows, reserved=limit)
        self.measured("claim", len(rows), started)
        local_deadline = self.shared.timing.local_deadline
        oldest = min((local_deadline(r.deadline_us) for r in rows), default=None)
        behind = full_claim_again(oldest, len(rows) == limit, time.time(), RECENT_WINDOW_MS / 1000.0)
        self.next_sweep = now if behind else now + FULL_CLAIM_EVERY
        return self.next_sweep - time.monotonic()
