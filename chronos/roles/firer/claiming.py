"""What the claimer and the sweeper have in common: a thread that claims due rows and hands them to the sender."""

from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple

from chronos.config import Settings
from chronos.domain.model import Claimed
from chronos.errors import ClaimContended, StoreUnavailable
from chronos.ports import ClaimStore, TakeStore
from chronos.roles.firer.batches import HeldBatches
from chronos.roles.firer.decisions import full_claim_again
from chronos.roles.firer.handoff import Claims, Shared
from chronos.roles.firer.store_thread import StoreThread
from chronos.runtime.process import Lifecycle
from chronos.telemetry.metrics import FirerTelemetry

RECENT_WINDOW_MS = 2000  # most claims take rows due at most this long ago (`Claimer.claim_rows`)
FULL_CLAIM_EVERY = 2.0   # seconds: a claim of every due row, however long ago, at least this often
# The cap on rows held, in batches: at 25,000 msg/s the lookahead alone holds 7,500 rows, and rows stay held
# until acknowledged and deleted; four batches (8,000) held claims back and made them late (publish lateness
# p99.9 167 ms, 79 ms with sixteen: docs/benchmarks/hot-path.md). The bytes they come to are capped apart
# (CHRONOS_FIRER_MAX_HELD_BYTES), so large messages cannot fill memory.
MAX_HELD_BATCHES = 16
CLAIM_AGAIN_SOON = 0.005  # seconds: after a claim that could take nothing now (the cap reached, a row contended)

# A claim proper: on a session of the claim that deletes (None: on the thread's store, which stamps), up to
# `limit` rows; (the rows, whether they are a backlog's)
Take = Callable[[TakeStore | None, int], tuple[list[Claimed], bool]]


class Took(NamedTuple):
    """What a claim took (`ClaimThread.claim_batch`), handed to the sender already."""

    rows: list[Claimed]
    backlog: bool    # it came back full: more is due
    started: float   # perf_counter, as the claim began
    room: int        # the rows of the firer's cap it had room for (its limit)


class ClaimThread(StoreThread[ClaimStore]):
    """A thread of the firer that claims due rows (`claimer.Claimer`, `sweeper.Sweeper`), pass after pass
    (`pass_once`), until `stop`. Each claim (`claim_batch`) reserves room on the firer's cap on held rows, runs on
    a free session of the claim that deletes (`HeldBatches`), whose transaction then holds its rows as one batch,
    and hands them to the sender (`outbox`). A claim that failed or was cancelled holds nothing and gives its room
    back."""

    def __init__(self, name: str, store: ClaimStore, settings: Settings, shared: Shared, telemetry: FirerTelemetry,
                 life: Lifecycle, outbox: Claims, batches: HeldBatches | None):
        super().__init__(name, store, settings, shared, telemetry, life)
        self.outbox, self.batches = outbox, batches
        self.limit = settings.batch_size
        self.max_held = settings.batch_size * MAX_HELD_BATCHES
        self.max_held_bytes = settings.firer_max_held_bytes
        self.stopped = threading.Event()
        self.claiming: TakeStore | None = None  # the session of the claim running now

    def loop(self) -> None:
        while not self.stopped.is_set():
            try:
                asked = time.monotonic()
                wait = self.pass_once()
                if self.answered_at() >= asked:  # a pass that ran no statement says nothing of PostgreSQL
                    self.outage.ok()
            except StoreUnavailable as exc:
                if self.stopped.is_set():  # the claim cancelled by stop()
                    return
                wait = self.outage.failed(exc)
            self.stopped.wait(max(0.0, wait))

    def pass_once(self) -> float:
        """Claim what is due now, if anything: how long to wait (seconds) before the next pass."""
        raise NotImplementedError

    def answered_at(self) -> float:
        """When PostgreSQL last answered one of this thread's statements (monotonic)."""
        return self.store.last_ok

    def stop(self) -> None:
        """Stop claiming (called from the sender's thread): a claim running now is cancelled, so a SIGTERM does not
        wait for a slow one. A cancelled claim rolls back and holds nothing."""
        self.stopped.set()
        session = self.claiming
        if session is not None:
            session.cancel()

    def claim_batch(self, take: Take) -> Took | None:
        """Run `take` with room reserved on the firer's cap, on a free session (with the claim that deletes), hold
        the rows it took there as a batch and hand them to the sender. None when nothing could be claimed now (as
        much held as the firer may, every session holding a batch, a row taken by another claim since this one chose
        it): claim again in CLAIM_AGAIN_SOON."""
        limit = self.shared.reserve(self.limit, self.max_held, self.max_held_bytes)
        if not limit:  # wait for acknowledgements before claiming more
            return None
        session = None
        if self.batches is not None:
            session = self.claiming = self.batches.session()
            if session is None:  # every session holds a batch: wait for the settler to end one
                self.shared.count_claimed([], reserved=limit)
                return None
        try:
            started, sent = time.perf_counter(), time.monotonic()
            rows, backlog = take(session, limit)
        except ClaimContended as exc:  # another claim took a row since this one chose it: claim again soon
            self.shared.count_claimed([], reserved=limit)
            self.release_session(session)
            self.throttle.warning("contended", "%s", exc)
            return None
        except BaseException as exc:  # a claim that failed or was cancelled holds nothing: its room is given back
            self.shared.count_claimed([], reserved=limit)
            self.release_session(session)
            if isinstance(exc, StoreUnavailable) and self.batches is not None and session is not None:
                self.batches.drop_idle()  # PostgreSQL is gone: its other free sessions are broken too
            raise
        finally:
            self.claiming = None
        if session is not None and self.batches is not None:
            if rows:
                self.batches.hold(session, rows)  # each row carries its batch before anyone else sees it
            else:
                self.release_session(session)
        self.hand_to_sender(sent, rows, reserved=limit)
        return Took(rows, backlog, started, limit)

    def release_session(self, session: TakeStore | None) -> None:
        """A session whose claim took nothing to hold (or failed): whatever it began rolled back, and free."""
        if session is not None and self.batches is not None:
            session.give_back()
            self.batches.free(session)

    def hand_to_sender(self, sent: float, rows: list[Claimed], reserved: int = 0) -> None:
        """Hand rows over with the time their claim was sent (monotonic): the database stamped them no
        earlier, so their age counted from it is never less than what a detector sees. `reserved`: the
        rows of the cap set aside for their claim, given back."""
        self.shared.count_claimed(rows, reserved)
        if rows:
            self.outbox.put((sent, rows))

    def next_full_claim_at(self, rows: list[Claimed], backlog: bool, now: float) -> float:
        """After a full claim that took `rows` (`now` monotonic, when it was due): when the next one is due, at once
        where it took rows due long ago or came back a backlog's (`full_claim_again`), else FULL_CLAIM_EVERY on."""
        local_deadline = self.shared.timing.local_deadline
        oldest = min((local_deadline(r.deadline_us) for r in rows), default=None)
        behind = full_claim_again(oldest, backlog, time.time(), RECENT_WINDOW_MS / 1000.0)
        return now if behind else now + FULL_CLAIM_EVERY
