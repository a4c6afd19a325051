"""The sweeper: a claimer's thread that takes the due rows its claims pass over, off the claims' path."""

from __future__ import annotations

import time

from chronos.domain.model import Claimed
from chronos.ports import ClaimStore, TakeStore
from chronos.roles.firer.batches import HeldBatches
from chronos.roles.firer.claimer import Claimer
from chronos.roles.firer.claiming import CLAIM_AGAIN_SOON, RECENT_WINDOW_MS, ClaimThread

SWEEP_MARGIN_MS = 50  # the sweep's bound lies this far below the claimer's mark (clock offsets, the statement's start)
IDLE_WAIT = 0.05      # seconds: how soon a sweeper that could not sweep (nothing claimed yet, claims paused) looks again


class Sweeper(ClaimThread):
    """A claimer's full claims, on a thread of their own (the claim that deletes, without fire-rate limits).

    A claimer's claims start where its last one ended (`ClaimCursor`): the rows below that mark it looks at again
    only if they were written since its last seq reads. The others below it (handed back, rolled back with a batch,
    written by a long transaction, due long ago) are the full claim's, every FULL_CLAIM_EVERY, which walks the due
    index from its head: past every row taken since the last full claim, whose entries the index still holds. Under
    load that walk is long (at 40,000 msg/s a quarter of a second and more), and a claimer that ran it itself
    claimed nothing meanwhile: the rows falling due then went out late. The sweeper runs it instead, on a session of
    the firer's (`HeldBatches`), bounded by the claimer's mark as its last claim left it (`Claimer.swept_from`;
    SWEEP_MARGIN_MS below it), so the two seldom choose the same row. When they do (a row written late below the
    mark, which the claimer's claims also look at), one takes it and the other's claim is given back
    (`ClaimContended`), after waiting for the row at most the session's lock timeout. Where the claimer has no mark
    (its last claim was one of the window, or left rows behind) the bound is the window's start, below which the
    claimer's claims do not look. A sweep is followed by another at once when it took rows due long ago or came back
    full (`full_claim_again`), as the claimer's full claims were. Its rows go to the sender with the claimer's."""

    def __init__(self, claimer: Claimer, store: ClaimStore, batches: HeldBatches):
        """`store` is the thread's own, which it opens only to close it (its claims run on `batches`' sessions)."""
        name = "sweeper" if claimer.part == 0 else f"sweeper{claimer.part + 1}"
        super().__init__(name, store, claimer.settings, claimer.shared, claimer.metrics, claimer.life, claimer.outbox,
                         batches)
        self.claimer = claimer
        self.next_sweep = 0.0  # monotonic
        self.last_ok = 0.0     # monotonic: PostgreSQL last answered a sweep
        claimer.swept = True

    def pass_once(self) -> float:
        return self.sweep(time.monotonic())

    def answered_at(self) -> float:
        return self.last_ok

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

        def take(session: TakeStore | None, limit: int) -> tuple[list[Claimed], bool]:
            assert session is not None  # a sweeper runs with the claim that deletes only
            bound = self.bound_ms(mark)
            rows, _ = (session.claim_whole(limit, bound) if slices is None
                       else session.claim_share(slices, limit, bound))
            self.last_ok = time.monotonic()
            return rows, len(rows) == limit

        claimed = self.claim_batch(take)
        if claimed is None:  # the cap reached, or a row taken by the claimer since it was chosen: look again soon
            return CLAIM_AGAIN_SOON
        rows, backlog, started, _ = claimed
        self.measured("claim", len(rows), started)
        self.next_sweep = self.next_full_claim_at(rows, backlog, now)
        return self.next_sweep - time.monotonic()
