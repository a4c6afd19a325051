"""The firer's decisions, pure: how long a row whose publish failed waits before its next publish
(`retry_delay_ms`; what becomes of it is the domain's `delivery.after_failure`), whether a full claim is
followed by another (`full_claim_again`), where a claim of recent rows starts (`ClaimCursor`), and when to
publish a row so that it lands on the output topic at its deadline (`PublishTiming`). What they depend on
comes in as arguments."""

from __future__ import annotations

from typing import Iterable

from chronos.domain.model import Mark

TICK = 0.001                 # the sender sleeps at least this long: rows due within it go together
RETRY_FIRST_MS = 1000        # backoff after a row's first refused publish; doubled after each further one
RETRY_CAP_MS = 60_000        # and never longer than this


def retry_delay_ms(failures_before: int) -> int:
    """How long a row waits before its next publish, given how many of its publishes failed before
    this one: 1 s, 2 s, 4 s, ... up to a minute."""
    return min(RETRY_CAP_MS, RETRY_FIRST_MS << min(failures_before, 16))


def full_claim_again(oldest: float | None, backlog: bool, now: float, window_s: float) -> bool:
    """Whether a full claim (every due row, however late) must be followed by another at once: it took a row
    due more than `window_s` before `now`, which only a full claim finds, or it came back full (`backlog`)
    with its oldest row in the window's older half (a backlog, whose rest could slip out of the window before
    the next claim). A full claim come back full with recent rows only is a busy moment: a claim of the window
    finds the same rows without walking the due index from its head. `oldest`: when the oldest row it took
    was due, in local time (None: it took none)."""
    if oldest is None:
        return False
    return oldest < now - window_s or (backlog and oldest < now - window_s / 2)


class ClaimCursor:
    """Where a claimer's next claim of recent rows starts, among all the due rows or its own slices'. The rows it
    took in the last moments are still in the due index: those in flight (deleted by transactions not yet
    committed, up to the lookahead ahead) and those whose batches committed since the index last learnt they
    were gone. A claim of the window visits each of them in the table before the rows it takes: at 10,000
    msg/s thousands a claim, most of its pick's time. So a claim that took every row it chose (none held back
    by its ordering key, none changed since it was chosen: `whole`) is followed by one that starts past its
    last row, in (deadline, seq) order.

    Below that mark the next claim looks, within the window, only at rows whose seq is past `since`: rows
    written since then, with a deadline already that close, which the index tells from the rows taken without
    a visit to the table. `since` is the messages' last seq as read two reads before the last (`seq_read`, read
    every SEQ_READ_EVERY): a row drawn before a read is looked at by the claims until the read after next, so
    one written by a transaction that lasted less than the time between two reads is found when it commits.
    A longer one's rows wait for the next full claim, as do rows that come back below the mark with an older
    seq (put back after a failed publish, replaced with a deadline that close). The full claim (every
    FULL_CLAIM_EVERY) starts the mark again. Where the schema cannot say the last seq, no claim looks below
    its mark: a claim starts past it only after one that came back full, and a claim of the window runs at
    least every `every` seconds and after any claim that came back short."""

    def __init__(self, every: float):
        self.every = every
        self.after: tuple[int, int] | None = None  # (deadline in µs, seq) of the last row the claims took
        self.window_at = 0.0  # monotonic: when the next claim is one of the window, whatever the mark
        self._reads: tuple[int, ...] = ()  # the last three reads of the last seq, oldest first
        self.slices: tuple[int, ...] | None = None  # the slices the claims take (None: every one)

    def within(self, slices: tuple[int, ...] | None) -> None:
        """The claims take these `slices` (chronos.domain.shares; None: every slice): when they change, rows of
        slices not taken before may lie below the mark, so the next claim is one of the window."""
        if slices != self.slices:
            self.slices, self.after = slices, None

    def seq_read(self, seq: int | None) -> None:
        """The messages' last seq, just read (None: the schema cannot say)."""
        self._reads = (*self._reads, seq)[-3:] if seq is not None else ()

    @property
    def since(self) -> int | None:
        """The last seq as read two reads before the last (None: not known yet, or the schema cannot say)."""
        return self._reads[0] if len(self._reads) == 3 else None

    def start(self, now: float, full: bool = False) -> Mark | None:
        """Where the claim at `now` (monotonic) starts: past the mark, or None (the window, or a `full` claim)."""
        if full or self.after is None or (self.since is None and now >= self.window_at):
            self.after, self.window_at = None, now + self.every
            return None
        return Mark(*self.after, self.since)

    def ended(self, rows: Iterable[tuple[int, int]], whole: bool, backlog: bool) -> None:
        """The claim took `rows` ((deadline in µs, seq) each, read only when the mark may move): `whole`, every
        row it chose; `backlog`, it came back full."""
        if self.since is None:
            self.after = max(rows, default=None) if backlog else None
        elif not whole:
            self.after = None
        else:  # rows found below the mark (written late) leave it where it is
            last = max(rows, default=None)
            if last is not None and (self.after is None or last > self.after):
                self.after = last


class PublishTiming:
    """When to publish a row so that it lands on the output topic at its deadline.

    `offset_us` is the database clock minus the local clock (deadlines are in database time),
    measured by the settler (`Settler.sync_clock`: its connection never waits behind a claim);
    `latency` is a moving average of produce→acknowledgement time, measured by the sender from its
    delivery reports. The sender publishes a row `advance` before its deadline: the latency plus one
    tick of its loop, capped at the configured timing advance so nothing is ever published earlier
    than that.
    """

    def __init__(self, timing_advance_ms: int):
        self.cap = timing_advance_ms / 1000.0
        self.latency = 0.0
        self.offset_us = 0
        self._best_rtt: float | None = None

    def observe_ack(self, seconds: float) -> None:
        self.latency += 0.05 * (seconds - self.latency)

    def observe_clock(self, db_us: int, before: float, after: float) -> None:
        """The database's clock read `db_us` between local times `before` and `after`."""
        rtt = after - before
        # keep the sample with the tightest round trip; re-accept slightly worse ones so drift is followed
        if self._best_rtt is None or rtt <= self._best_rtt * 2:
            self._best_rtt = rtt if self._best_rtt is None else min(rtt, self._best_rtt)
            # the database read its clock somewhere in [before, after]: assuming the latest moment
            # (the smallest offset) means a slow round trip can make firing late, never early
            self.offset_us = db_us - int(after * 1e6)

    @property
    def advance(self) -> float:
        """How long before its deadline a row is published. The sender's loop wakes once per tick at
        most and publishes what falls due before the next tick, so rows go out between
        latency + tick and latency before their deadline."""
        return min(self.latency + TICK, self.cap)

    def local_deadline(self, deadline_us: int) -> float:
        """The deadline (database time) on the local wall clock, in seconds."""
        return (deadline_us - self.offset_us) / 1e6
