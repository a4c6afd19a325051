"""`chronos firer`: store → output topic at each message's deadline.

Claims due rows (and rows due within the lookahead) in batches with one
`UPDATE ... RETURNING`, publishes each from memory at its deadline less the measured
publish latency (never more than the timing advance), waits for Kafka's acknowledgement,
then deletes exactly the acknowledged rows it still owns. Unpublished rows are handed back
on shutdown. A publish that fails goes through one path (`publish_failed`): a refusal that may
pass is retried with exponential backoff, kept in PostgreSQL (the row's `attempts` and moved
`deadline`), up to CHRONOS_MAX_PUBLISH_ATTEMPTS; a permanent one (too large, invalid), an
exhausted one and a destination the allow-list no longer allows go to the dead-letter topic;
what even the dead-letter topic refuses is parked in `chronos_parked`.

Three threads, each on what it alone owns; what they read of each other is in `Shared`:

- `Claimer` claims rows (pacing, back-pressure, the cap on held rows, recurring schedules) on a
  store of its own and hands them to the publishing thread;
- `FirerProcess`, the publishing thread, keeps them in deadline order (`Held`), publishes them and
  sends their outcomes (`Outcomes`, then `Stop`) to the settling thread;
- `Settler` settles them on a store of its own: deletes, hands back, retries later, parks.

A row is *held* from its claim until it is settled; the SQL marks it with `readied_at`.
"""

from __future__ import annotations

import bisect
import enum
import functools
import itertools
import logging
import queue
import random
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from confluent_kafka import KafkaError

from chronos import codec
from chronos.config import Settings
from chronos.errors import ConfigError, StoreUnavailable
from chronos.adapters.kafka.clients import (PERMANENT_FAILURE, PRODUCER_FAILURE, UNANSWERED_FAILURE, OutageLog,
                                            dead_letter_headers, failure_reason, make_producer, produce)
from chronos.adapters.kafka.watch import ProducerWatch, retire
from chronos.runtime.logs import Throttle
from chronos.ops.telemetry import FirerTelemetry
from chronos.runtime.process import Lifecycle
from chronos.runtime.backoff import POSTGRES_RETRY_CAP_S, Outage
from chronos.domain import reasons
from chronos.domain.model import Claimed
from chronos.adapters.postgres.store import role_store
from chronos.ports import ClaimStore, Publisher, SettleStore, Store, StoreHandle

log = logging.getLogger("chronos.firer")

DELETE_BATCH = 1000          # acknowledged rows deleted in one statement at most
DELETE_EVERY = 0.02          # seconds between deletes while acknowledgements trickle in
CLOCK_SYNC_EVERY = 10.0      # seconds between measurements of the database clock offset
IDLE_WAIT = 0.005            # the publishing thread looks for newly claimed rows this often
SLOW_STATEMENT = 1.0         # seconds: a claim or delete slower than this is logged (aggregated)
TICK = 0.001                 # the publishing thread sleeps at least this long: rows due within it go together
RETRY_FIRST_MS = 1000        # backoff after a row's first refused publish; doubled after each further one
RETRY_CAP_MS = 60_000        # and never longer than this


class AfterFailure(enum.Enum):
    """What becomes of a row whose publish failed."""

    RELEASE = "release"  # handed back as it is
    RETRY = "retry"      # kept, published again after a backoff
    DEAD = "dead"        # to the dead-letter topic


def retry_delay_ms(failures_before: int) -> int:
    """How long a row waits before its next publish, given how many of its publishes failed before
    this one: 1 s, 2 s, 4 s, ... up to a minute."""
    return min(RETRY_CAP_MS, RETRY_FIRST_MS << min(failures_before, 16))


def after_failure(kind: str, failures: int, max_attempts: int) -> AfterFailure:
    """What to do with a row whose publish failed (`kind` from `ProducerWatch.failed`; `failures`
    counts this one): dead-letter it, retry it after a backoff, or hand it back as it is (Kafka
    did not answer, or the producer itself is at fault: that says nothing about the message, and
    the firer stops claiming meanwhile)."""
    if kind == PERMANENT_FAILURE:
        return AfterFailure.DEAD
    if kind in (UNANSWERED_FAILURE, PRODUCER_FAILURE):
        return AfterFailure.RELEASE
    return AfterFailure.DEAD if failures >= max_attempts else AfterFailure.RETRY


def iso_us(us: int) -> str:
    """Epoch microseconds as ISO-8601 UTC with microseconds (a chronosDeadline the consumer reads)."""
    seconds, micros = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


class PublishTiming:
    """When to publish a row so that it lands on the output topic at its deadline.

    `offset_us` is the database clock minus the local clock (deadlines are in database time);
    `latency` is a moving average of produce→acknowledgement time, used as the advance (plus one
    tick of the publishing loop), capped at the configured timing advance so nothing is ever
    published earlier than that.
    """

    def __init__(self, timing_advance_ms: int):
        self.cap = timing_advance_ms / 1000.0
        self.latency = 0.0
        self.offset_us = 0
        self._best_rtt: float | None = None

    def observe_ack(self, seconds: float) -> None:
        self.latency += 0.05 * (seconds - self.latency)

    def observe_clock(self, db_us: int, before: float, after: float) -> None:
        rtt = after - before
        # keep the sample with the tightest round trip; re-accept slightly worse ones so drift is followed
        if self._best_rtt is None or rtt <= self._best_rtt * 2:
            self._best_rtt = rtt if self._best_rtt is None else min(rtt, self._best_rtt)
            # the database read its clock somewhere in [before, after]: assuming the latest moment
            # (the smallest offset) means a slow round trip can make firing late, never early
            self.offset_us = db_us - int(after * 1e6)

    @property
    def advance(self) -> float:
        """How long before its deadline a row is published. The publishing loop wakes once per tick
        at most and publishes what falls due before the next tick, so rows go out between
        latency + tick and latency before their deadline."""
        return min(self.latency + TICK, self.cap)

    def local_deadline(self, deadline_us: int) -> float:
        """The deadline (database time) on the local wall clock, in seconds."""
        return (deadline_us - self.offset_us) / 1e6


class FirerTotals:
    """The firer's running totals, exported as counters (`FirerTelemetry.totals`) and logged at
    the end. `claimed` is written by the claiming thread; the others by the settling thread, and
    `released` also by the publishing thread at shutdown, once the settling thread has ended."""

    __slots__ = ("claimed", "fired", "vanished", "released", "retried", "dead", "parked", "expired")

    def __init__(self) -> None:
        self.claimed = self.fired = self.vanished = self.released = self.retried = self.dead = self.parked = 0
        self.expired = 0  # written by the publishing thread

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class Shared:
    """What the firer's three threads know of each other. Every field has one writer; the others
    only read it (an int or a float, read whole under the GIL).

    A row is *held* from its claim (SQL: `readied_at` set) until it is settled: deleted once
    fired or dead-lettered, handed back, put off for a retry, or parked.

    - the claiming thread writes `totals.claimed`, the rows it ever claimed;
    - the settling thread writes `settled`, the rows it ever settled, and `timing.offset_us`;
    - the publishing thread writes `in_flight`, `ack_progress`, `sent_at`, `timing.latency` and
      `claims_resume_at`.
    """

    def __init__(self, timing: PublishTiming):
        self.totals = FirerTotals()
        self.settled = 0
        self.timing = timing
        self.in_flight = 0        # publishes waiting for Kafka's acknowledgement
        self.ack_progress = 0.0   # monotonic: the last acknowledgement, or the first publish since none was in flight
        self.sent_at: deque[float] = deque()  # monotonic send time of each publish in flight, oldest first
        self.claims_resume_at = 0.0  # monotonic: rows were handed back for a producer fault; claim none before

    def held(self) -> int:
        """Rows claimed by this firer and not settled yet."""
        return self.totals.claimed - self.settled

    def stalled(self, now: float) -> float:
        """How long Kafka has kept the firer waiting (`now` monotonic): since the last acknowledgement
        while publishes are in flight, or the age of the oldest publish in flight, whichever is
        longer. Acknowledgements come back about in publish order, so one send time is dropped from
        the front per acknowledgement."""
        stalled = now - self.ack_progress if self.in_flight else 0.0
        try:
            return max(stalled, now - self.sent_at[0])
        except IndexError:  # emptied by the publishing thread meanwhile
            return stalled

    # -- written by the publishing thread -----------------------------------------------------

    def sending(self, sent: float) -> None:
        if not self.in_flight:
            self.ack_progress = time.monotonic()
        self.in_flight += 1
        self.sent_at.append(sent)

    def delivered(self, count: int = 1) -> None:
        """`count` publishes were answered (acknowledged or failed)."""
        self.in_flight -= count
        sent_at = self.sent_at
        for _ in range(min(count, len(sent_at))):
            sent_at.popleft()
        self.ack_progress = time.monotonic()


@dataclass
class Outcomes:
    """What became of held rows, sent by the publishing thread to the settling thread, which
    settles them in the store."""

    acked: list[Claimed] = field(default_factory=list)                  # acknowledged: to delete
    release: list[Claimed] = field(default_factory=list)                # not published: to hand back as they are
    retry: list[tuple[Claimed, str, int]] = field(default_factory=list)  # (row, error, delay_ms): refused, try later
    dead: list[tuple[Claimed, str]] = field(default_factory=list)        # (row, reason): dead-lettered, to delete
    park: list[tuple[Claimed, str]] = field(default_factory=list)        # (row, reason): the dead-letter topic refused

    def __bool__(self) -> bool:
        return bool(self.acked or self.pending())

    def pending(self) -> bool:
        """Rows settled at once (acknowledged rows are deleted in batches)."""
        return bool(self.release or self.retry or self.dead or self.park)

    def add(self, other: "Outcomes") -> None:
        self.acked += other.acked
        self.release += other.release
        self.retry += other.retry
        self.dead += other.dead
        self.park += other.park

    def count(self) -> int:
        return len(self.acked) + len(self.release) + len(self.retry) + len(self.dead) + len(self.park)


class Stop:
    """Sent to the settling thread after the last `Outcomes`: settle them all, then end."""


S = TypeVar("S", bound=StoreHandle)


class StoreThread(threading.Thread, Generic[S]):
    """A thread of the firer that talks to PostgreSQL, on a store of its own (a store is one
    connection, not thread-safe), which it closes when it ends; its port says which statements it
    may run. psycopg releases the GIL while it waits on the network, so no statement of these threads
    delays a publish that is due."""

    def __init__(self, name: str, store: S, settings: Settings, shared: Shared, telemetry: FirerTelemetry,
                 life: Lifecycle):
        super().__init__(name=name, daemon=True)
        self.store, self.settings, self.shared, self.metrics, self.life = store, settings, shared, telemetry, life
        self.throttle = Throttle(log)
        self.outage = Outage(log, cap=POSTGRES_RETRY_CAP_S)
        self.crashed: BaseException | None = None

    def run(self) -> None:
        try:
            self.loop()
        except ConfigError as exc:  # final (a pooler the settings did not expect): the process ends with it, one line
            self.crashed = exc
            self.life.stop()
        except BaseException as exc:  # noqa: BLE001 - the process stops as a whole when this thread dies
            log.exception("the %s thread failed; stopping the firer", self.name)
            self.crashed = exc
            self.life.stop()
        finally:
            self.store.close()

    def loop(self) -> None:
        raise NotImplementedError

    def measured(self, step: str, rows: int, started: float) -> None:
        """Record a statement's duration; one slow enough to hold up firing is also logged, since
        while a claim runs nothing more is claimed, and while a delete runs held rows age towards the
        hold time."""
        elapsed = time.perf_counter() - started
        self.metrics.batch(step, rows, elapsed)
        if elapsed > SLOW_STATEMENT:
            self.throttle.warning("slow " + step, "slow %s: %.1fs for %d rows (%d rows held by this firer)",
                                  step, elapsed, rows, self.shared.held())


class Claimer(StoreThread[ClaimStore]):
    """Where rows are claimed: due rows (within each rate-limited topic's budget) and recurring
    schedules' occurrences, handed to the publishing thread through `outbox`. It paces itself:
    at once again while a claim comes back full (a backlog), otherwise after the poll interval;
    it claims nothing while Kafka keeps publishes waiting (back-pressure) nor beyond `max_held`
    rows held. On a thread and connection of its own, apart from the settling (`Settler`): a
    claim that runs long (a lock, a plan gone bad) stops only further claims, and the rows
    already held keep being deleted once published, so none of them ages past the hold time into
    a peer's hands."""

    def __init__(self, store: ClaimStore, settings: Settings, shared: Shared, telemetry: FirerTelemetry, life: Lifecycle,
                 outbox: "queue.SimpleQueue[tuple[float, list[Claimed]]]"):
        super().__init__("firer-claim", store, settings, shared, telemetry, life)
        self.outbox = outbox
        self.limit = settings.batch_size
        self.limits = settings.fire_rates
        if self.limits:
            log.info("fire-rate limits: %s", self.limits)
        self.max_held = settings.batch_size * 4
        self.stopped = threading.Event()
        self.claims_paused = False
        self.next_claim = 0.0
        self.next_schedules = 0.0

    def loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self.claim(time.time())
                wait = self.next_claim - time.time()
                self.outage.ok()
            except StoreUnavailable as exc:
                if self.stopped.is_set():  # the claim cancelled by stop()
                    return
                wait = self.outage.failed(exc)
            self.stopped.wait(max(0.0, wait))

    def stop(self) -> None:
        """Stop claiming (called from the publishing thread): a claim running now is cancelled, so a
        SIGTERM does not wait for a slow one. A cancelled claim rolls back and holds nothing."""
        self.stopped.set()
        self.store.cancel()

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
                log.warning("a publish has waited %.1fs for Kafka's acknowledgement: claiming nothing until "
                            "Kafka catches up", stalled)
            self.next_claim = now + 0.05
            return
        if self.claims_paused:
            self.claims_paused = False
            log.warning("Kafka acknowledges again: claiming rows")
        if time.monotonic() < self.shared.claims_resume_at:  # the producer is being replaced: rows would bounce
            self.next_claim = now + 0.05
            return
        held = self.shared.held()
        if held >= self.max_held:
            self.next_claim = now + 0.005  # wait for acknowledgements before claiming more
            return
        limit = min(self.limit, self.max_held - held)
        started, sent = time.perf_counter(), time.monotonic()
        if self.limits:  # fire-rate limits: topic by topic, within each limited topic's budget
            rows, backlog = self.store.claim_limited(self.limits, self.settings.output_topic, limit,
                                                     self.settings.lookahead_ms)
        else:
            rows = self.store.claim(limit, self.settings.lookahead_ms)
            backlog = len(rows) == limit
        self.hand_to_publisher(sent, rows)  # before the schedules' claim, which may be the slow one
        occurrences = []
        if now >= self.next_schedules:  # recurring schedules: once per poll interval, even in a backlog
            self.next_schedules = now + self.settings.poll_interval_ms / 1000.0
            sent = time.monotonic()
            occurrences = self.store.claim_schedules(limit, self.settings.lookahead_ms, time.time_ns() // 1000)
            self.hand_to_publisher(sent, occurrences)
        self.measured("claim", len(rows) + len(occurrences), started)
        if backlog:
            self.next_claim = now  # a backlog: drain it without sleeping
        else:
            interval = self.settings.poll_interval_ms / 1000.0
            self.next_claim = now + interval * random.uniform(0.9, 1.1)

    def hand_to_publisher(self, sent: float, rows: list[Claimed]) -> None:
        """Hand rows over with the time their claim was sent (monotonic): the database stamped them no
        earlier, so their age counted from it is never less than what a detector sees."""
        if rows:
            self.shared.totals.claimed += len(rows)
            self.outbox.put((sent, rows))


class Settler(StoreThread[SettleStore]):
    """Settles held rows as the publishing thread reports their outcomes (`inbox`): deletes the
    acknowledged ones in batches, hands back, retries later, deletes as dead-lettered or parks
    the others; and measures the database clock. On its own thread and connection: never behind
    a claim (`Claimer`)."""

    def __init__(self, store: SettleStore, settings: Settings, shared: Shared, telemetry: FirerTelemetry,
                 life: Lifecycle):
        super().__init__("firer-store", store, settings, shared, telemetry, life)
        self.inbox: queue.SimpleQueue[Outcomes | Stop] = queue.SimpleQueue()
        self.todo = Outcomes()
        self.stopping = False
        self.next_clock_sync = 0.0
        self.last_delete = 0.0
        self.down_until = 0.0

    def loop(self) -> None:
        while True:
            self.receive(self.wait_time())
            now = time.time()
            if now < self.down_until:
                continue
            try:
                self.settle(now)
                if self.stopping:
                    if not self.todo:
                        return
                    continue
                if now >= self.next_clock_sync:
                    self.sync_clock(now)
                self.outage.ok()
            except StoreUnavailable as exc:
                if self.stopping and self.outage.down_for() > 5:
                    log.warning("postgres unavailable at shutdown (%s): %d held rows will be taken over "
                                "after the hold time", exc, self.todo.count())
                    return
                self.down_until = time.time() + self.outage.failed(exc)

    def wait_time(self) -> float:
        now = time.time()
        if now < self.down_until:  # PostgreSQL is away: nothing to do before the next try
            return min(self.down_until - now, 1.0)
        wake = now + 1.0 if self.stopping else self.next_clock_sync
        if self.todo.acked:
            wake = min(wake, self.last_delete + DELETE_EVERY)
        if self.todo.pending() or (self.stopping and self.todo.acked):
            wake = now
        return max(0.0, min(wake - now, 1.0))

    def receive(self, timeout: float) -> None:
        """Take what the publishing thread sent: outcomes, or the stop."""
        try:
            item = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, Stop):
                self.stopping = True
            else:
                self.todo.add(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def settle(self, now: float) -> None:
        """Delete acknowledged rows in batches, hand back rows that will not be published, and settle
        failed ones: retried later, deleted once dead-lettered, or parked."""
        todo, totals = self.todo, self.shared.totals
        if todo.release:
            totals.released += self.store.release(todo.release)
            self.shared.settled += len(todo.release)
            todo.release = []
        if todo.retry:
            totals.retried += self.store.retry_later(todo.retry)
            self.shared.settled += len(todo.retry)
            todo.retry = []
        if todo.dead:
            totals.dead += self.store.delete_fired([row for row, _ in todo.dead])
            self.metrics.dead_lettered(reason for _, reason in todo.dead)
            self.shared.settled += len(todo.dead)
            todo.dead = []
        if todo.park:
            totals.parked += self.store.park_claimed(todo.park, self.settings.output_topic)
            for row, reason in todo.park:
                log.warning("parked %s in chronos_parked: neither %s nor the dead-letter topic %s took it (%s)",
                            row.id, row.topic or self.settings.output_topic, self.settings.dlq_topic, reason)
            self.shared.settled += len(todo.park)
            todo.park = []
        if not todo.acked or (len(todo.acked) < DELETE_BATCH and now - self.last_delete < DELETE_EVERY
                              and not self.stopping):
            return
        self.last_delete = now
        while todo.acked:
            done = todo.acked[:DELETE_BATCH]
            started = time.perf_counter()
            deleted = self.store.delete_fired(done)
            del todo.acked[:DELETE_BATCH]
            self.shared.settled += len(done)
            self.measured("delete", len(done), started)
            totals.fired += len(done)
            if deleted < len(done):
                totals.vanished += len(done) - deleted
                self.throttle.warning("vanished", "%d published rows were no longer ours to delete "
                                      "(taken over by a peer after the hold time)", len(done) - deleted)

    def sync_clock(self, now: float) -> None:
        self.next_clock_sync = now + CLOCK_SYNC_EVERY
        self.store.db_clock_us()  # (re)connect first if need be: a connect inside the measurement skews it
        before = time.time()
        db_us = self.store.db_clock_us()
        self.shared.timing.observe_clock(db_us, before, time.time())


# (local deadline, seq, arrival, claimed at (monotonic: when its claim was sent), row): never compares rows
HeldEntry = tuple[float, int, int, float, Claimed]
_AFTER_ANY = float("inf")  # (horizon, inf) sorts after every entry of that deadline: seq is an int


class Held:
    """The rows the publishing thread holds, in publishing order: the local deadline (the deadline as
    scheduled, on this machine's clock), then the row's enqueue order, then arrival.

    A sorted list read from `head` on. A claim takes rows in deadline order, so its rows nearly always
    go after every row held: they are appended as they come, and each publish takes a run from the
    front, one comparison per row either way. A claim with rows earlier than some held ones (a retry,
    a message due within the lookahead that came after the previous claim) is merged in from its
    place on. A heap's pop compared entries about log2(n) times per row instead (16 at 10,000 held
    rows): 1.8 µs of the publishing thread's 6 µs per message at 10,000 msg/s.

    `take_due` also sets apart rows claimed too long ago to be this firer's still (see
    `FirerProcess.expired_before`); `oldest_claim`, a bound no later than the claim of any row held,
    spares the look at each row's claim while none can be that old."""

    COMPACT_AT = 4096  # drop the taken entries once this many and half the list are taken

    def __init__(self) -> None:
        self.entries: list[HeldEntry] = []
        self.head = 0
        self.oldest_claim = _AFTER_ANY

    def __len__(self) -> int:
        return len(self.entries) - self.head

    def first(self) -> float | None:
        """The earliest local deadline held, None when nothing is."""
        return self.entries[self.head][0] if self.head < len(self.entries) else None

    def add(self, new: list[HeldEntry], claimed_at: float) -> None:
        """Hold the rows of one claim, sent at `claimed_at` (each entry carries it too)."""
        if not new:
            return
        new.sort()  # a claim's rows come sorted: one comparison each
        entries = self.entries
        if self.head == len(entries):
            entries.clear()
            self.head = 0
            self.oldest_claim = _AFTER_ANY
        self.oldest_claim = min(self.oldest_claim, claimed_at)
        if not entries or entries[-1] < new[0]:
            entries.extend(new)
            return
        at = bisect.bisect_left(entries, new[0], lo=self.head)
        tail = entries[at:]
        del entries[at:]
        entries.extend(sorted(tail + new))  # two sorted runs: merged by the sort in linear time

    def take_due(self, horizon: float, expired_before: float = -_AFTER_ANY) -> tuple[list[Claimed], list[Claimed]]:
        """The rows whose local deadline is at or before `horizon`, in order, taken out: (those to
        publish, those claimed before `expired_before`, monotonic, which must not be)."""
        entries, head = self.entries, self.head
        end = bisect.bisect_right(entries, (horizon, _AFTER_ANY), lo=head)
        if end == head:
            return [], []
        expired: list[Claimed] = []
        if self.oldest_claim >= expired_before:
            due = [entry[4] for entry in entries[head:end]]
        else:
            due = []
            for entry in entries[head:end]:
                (expired if entry[3] < expired_before else due).append(entry[4])
            self.oldest_claim = min((entry[3] for entry in entries[end:]), default=_AFTER_ANY)
        if end >= self.COMPACT_AT and 2 * end >= len(entries):
            del entries[:end]
            end = 0
        self.head = end
        return due, expired

    def take_all(self) -> list[Claimed]:
        rows = [entry[4] for entry in self.entries[self.head:]]
        self.entries, self.head, self.oldest_claim = [], 0, _AFTER_ANY
        return rows


class FirerProcess:
    """The publishing thread: keeps held rows in deadline order (`Held`) and publishes each on time.
    Starts the claiming (`Claimer`) and settling (`Settler`) threads and stops them at the end."""

    def __init__(self, settings: Settings, life: Lifecycle, *, stores: Callable[[], Store],
                 producers: Callable[[], tuple[Publisher, OutageLog]], telemetry: FirerTelemetry):
        """`stores` makes one store per thread (a store is one connection, not thread-safe);
        `producers` makes a Kafka producer and the log of its outages, again after a fatal error."""
        self.settings, self.life = settings, life
        self.stores, self.producers = stores, producers
        self.producer, self.outage = producers()
        self.generation = 0                    # of the producer: reports of a replaced one only hand rows back
        self.retired: list[Publisher] = []    # replaced producers with delivery reports still to serve
        self.watch = ProducerWatch("the firer", settings.publish_stall_ms / 1000.0, time.monotonic())
        self.shared = Shared(PublishTiming(settings.timing_advance_ms))
        self.timing = self.shared.timing
        self.throttle = Throttle(log)
        self.claimed: queue.SimpleQueue[tuple[float, list[Claimed]]] = queue.SimpleQueue()
        # a held row claimed longer ago than this may be a peer's already (a detector hands back rows held
        # past the hold time): handed back, never published; a quarter of the hold time is left for the
        # publish to land and for the clocks of the detector's database and this machine to differ
        self.hold_limit = settings.hold_time_ms * 0.75 / 1000.0
        self.held = Held()
        self.seq = itertools.count()
        self.done = Outcomes()                            # settled outcomes not handed to the settler yet
        self.to_dead: list[tuple[Claimed, str]] = []      # to publish on the dead-letter topic
        # delivery reports not taken yet, in the order they came: (row, sent, producer generation, the
        # dead-letter reason of a dead letter (else None), error or None); see `take_reports`
        self.reports: list[tuple[Claimed, float, int, str | None, KafkaError | None]] = []
        self.reported = self._reported  # bound once: each publish's callback is a partial of it
        self.allowed = settings.allowed_topics_re
        self.metrics = telemetry
        self.settler = Settler(stores(), settings, self.shared, telemetry, life)
        self.claimer = Claimer(stores(), settings, self.shared, telemetry, life, self.claimed)
        self.metrics.follow(self.shared.totals.as_dict)
        self.metrics.follow_timing(lambda: len(self.held) + self.shared.in_flight, self.timing)
        self.metrics.follow_producer(self.watch)
        self.metrics.follow_postgres(lambda: [self.settler.store.link, self.claimer.store.link])

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        log.info("firing from the store to %s: batch %d, lookahead %d ms, poll %d ms, timing advance %d ms",
                 self.settings.output_topic, self.settings.batch_size, self.settings.lookahead_ms,
                 self.settings.poll_interval_ms, self.settings.timing_advance_ms)
        # `last_ok` is a float the store threads write: reading it uses no connection
        self.metrics.serve(postgres=lambda: max(self.settler.store.last_ok, self.claimer.store.last_ok),
                           kafka=lambda: self.producer, kafka_topic=self.settings.output_topic)
        self.settler.start()
        self.claimer.start()
        try:
            while self.life.running:
                self.metrics.beat()
                self.take_claimed()
                self.publish_due()
                self.send_dead()
                self.producer.poll(self.wait_time())
                self.look_after_producer()
                self.hand_over()
        finally:
            self.shutdown()
        for thread in (self.settler, self.claimer):
            if isinstance(thread.crashed, ConfigError):
                raise thread.crashed
            if thread.crashed is not None:
                raise RuntimeError(f"the firer's {thread.name} thread failed") from thread.crashed

    def take_claimed(self) -> None:
        while True:
            try:
                sent, rows = self.claimed.get_nowait()
            except queue.Empty:
                return
            # deadline, then enqueue order: rows of one ordering key are published in that order
            seq, offset_us = self.seq, self.timing.offset_us
            # by the deadline as scheduled: a retried row goes out as soon as its backoff let it be
            # claimed, ahead of the later rows of its key claimed with it (PublishTiming.local_deadline, inline)
            self.held.add([((row.scheduled_us - offset_us) / 1e6, row.seq, next(seq), sent, row) for row in rows], sent)

    def wait_time(self) -> float:
        """Until the next publish is due; new claims are looked at every few milliseconds. Never
        less than a tick: at 1,000 msg/s deadlines are a millisecond apart, and waking for each one
        (librdkafka's poll rounds a sub-millisecond wait down to none) spun a whole core."""
        wait = IDLE_WAIT
        first = self.held.first()
        if first is not None:
            wait = min(wait, first - self.timing.advance - time.time())
        return max(TICK, wait)

    def hand_over(self) -> None:
        """Send the outcomes of publishes to the settling thread."""
        self.take_reports()
        if self.done:
            if self.done.acked:
                self.outage.ok()
            self.settler.inbox.put(self.done)
            self.done = Outcomes()

    def publish_due(self) -> None:
        if not self.held:
            return
        started = time.perf_counter()
        due, expired = self.held.take_due(time.time() + self.timing.advance, time.monotonic() - self.hold_limit)
        if expired:
            self.expired(expired)
        if due:
            self.publish(due)
            self.metrics.batch("publish", len(due), time.perf_counter() - started)

    def expired(self, rows: list[Claimed]) -> None:
        """Rows claimed too long ago to be published: this firer was stopped or starved (a frozen VM, a
        SIGSTOP, a claim that took as long) and a peer may hold them, or have fired them, by now. They
        are handed back, which changes nothing if they are a peer's already."""
        self.shared.totals.expired += len(rows)
        self.done.release += rows
        log.warning("%d held rows were claimed more than %.1fs ago (this firer was stopped or starved meanwhile): "
                    "handed back unpublished, since a peer may have taken them over", len(rows), self.hold_limit)

    def publish(self, rows: list[Claimed]) -> None:
        """Publish due rows, in order. Their delivery reports are queued as they come (`_reported`)
        and taken in that order by `take_reports`, after the poll that served them: per message, a
        partial and a list append instead of a closure and half a dozen calls."""
        output, allowed, producer, shared = self.settings.output_topic, self.allowed, self.producer, self.shared
        reported, decode = self.reported, codec.decode_headers
        sent, generation = time.monotonic(), self.generation
        for row in rows:
            topic = row.topic
            # the allow-list in force now, not the one the message was accepted under
            if topic is not None and topic != output and not allowed.fullmatch(topic):
                self.to_dead.append((row, f"{reasons.TOPIC_NOT_ALLOWED}: {topic!r} does not match CHRONOS_ALLOWED_TOPICS"))
                continue
            shared.sending(sent)
            produce(producer, topic or output, row.value, row.key, decode(row.headers),
                    functools.partial(reported, row, sent, generation, None))

    def _reported(self, row: Claimed, sent: float, generation: int, reason: str | None, err, _msg) -> None:
        """A delivery report, as librdkafka hands it over: queued for `take_reports`."""
        self.reports.append((row, sent, generation, reason, err))

    def take_reports(self) -> None:
        """Take the queued delivery reports, in the order they came: an acknowledged row is timed
        and kept for the delete, a failed publish goes through `publish_failed`, a dead letter's
        report through `dead_letter_reported`. A run of acknowledgements is accounted at once."""
        if not self.reports:
            return
        reports, self.reports = self.reports, []
        shared, timing, acked = self.shared, self.timing, self.done.acked
        now, wall = time.monotonic(), time.time()
        latency, offset_us, run, lateness = timing.latency, timing.offset_us, 0, []
        for row, sent, generation, reason, err in reports:
            if err is None and reason is None:
                latency += 0.05 * (now - sent - latency)  # PublishTiming.observe_ack, inline
                lateness.append(wall - (row.scheduled_us - offset_us) / 1e6)  # PublishTiming.local_deadline
                acked.append(row)
                run += 1
                continue
            if run:
                self.acknowledged(run, latency, now)
                run = 0
            shared.delivered()
            if reason is None:
                self.publish_failed(row, err, generation)
            else:
                self.dead_letter_reported(row, reason, generation, err)
        if run:
            self.acknowledged(run, latency, now)
        self.metrics.fired(lateness)

    def acknowledged(self, count: int, latency: float, now: float) -> None:
        """`count` publishes were acknowledged (the publish latency averaged over them is `latency`)."""
        self.shared.delivered(count)
        self.timing.latency = latency
        self.watch.acked(now)

    def failure_kind(self, err, topic: str, generation: int) -> str:
        """What a failed publish means (`ProducerWatch.failed`); a report of a producer replaced since
        says nothing more about the message (purged, or failed like the rest): hand it back."""
        if generation != self.generation:
            return PRODUCER_FAILURE
        kind = self.watch.failed(err, topic, time.monotonic())
        if kind == PRODUCER_FAILURE:  # replaced at the next pass of the loop; claim nothing meanwhile
            self.shared.claims_resume_at = time.monotonic() + 0.2
        return kind

    def publish_failed(self, row: Claimed, err, generation: int) -> None:
        """The one path of a failed publish, whether librdkafka refused it in `produce()` or in the
        delivery report: hand it back, retry it after a backoff, or dead-letter it."""
        failures = row.attempts + 1
        topic = row.topic or self.settings.output_topic
        kind = self.failure_kind(err, topic, generation)
        action = after_failure(kind, failures, self.settings.max_publish_attempts)
        if action is AfterFailure.RELEASE:
            self.throttle.warning("publish", "publish of %s failed: %s; handing it back", row.id, err.str())
            self.done.release.append(row)
        elif action is AfterFailure.RETRY:
            delay = retry_delay_ms(row.attempts)
            self.throttle.warning("retry", "publish of %s to %s failed (%s): attempt %d of %d, next in %.1fs",
                                  row.id, topic, err.str(), failures, self.settings.max_publish_attempts,
                                  delay / 1000)
            self.done.retry.append((row, f"{err.name()}: {err.str()}", delay))
        else:
            reason = failure_reason(err)
            if kind != PERMANENT_FAILURE:
                reason += f" ({failures} attempts)"
            self.throttle.warning("dead", "publish of %s to %s failed for good: %s; to the dead-letter topic",
                                  row.id, topic, reason)
            self.to_dead.append((row, reason))

    def send_dead(self) -> None:
        """Publish the rows to dead-letter, each with its original id, deadline (as scheduled) and
        destination, plus chronosError and chronosSource `store/<id>`."""
        self.take_reports()  # a report taken may dead-letter its row
        pending, self.to_dead = self.to_dead, []
        for row, reason in pending:
            headers = [("chronosMessageId", row.id.encode()), ("chronosDeadline", iso_us(row.scheduled_us).encode())]
            if row.topic is not None:
                headers.append(("chronosTopic", row.topic.encode()))
            headers = dead_letter_headers(headers + codec.decode_headers(row.headers), reason, f"store/{row.id}")
            sent = time.monotonic()
            self.shared.sending(sent)
            produce(self.producer, self.settings.dlq_topic, row.value, row.key, headers,
                    functools.partial(self.reported, row, sent, self.generation, reason))

    def dead_letter_reported(self, row: Claimed, reason: str, generation: int, err) -> None:
        """The delivery report of a dead letter: the row is deleted once dead-lettered, parked if the
        dead-letter topic refuses it for good, handed back or retried later otherwise."""
        if err is None:
            self.watch.acked(time.monotonic())
            self.done.dead.append((row, reason))
            return
        kind = self.failure_kind(err, self.settings.dlq_topic, generation)
        if kind == PERMANENT_FAILURE:
            self.done.park.append((row, f"{reason}; dead-letter topic: {err.name()}: {err.str()}"))
        elif kind in (UNANSWERED_FAILURE, PRODUCER_FAILURE):
            self.done.release.append(row)
        else:  # the dead-letter topic refuses for now: the whole row is tried again after a backoff
            self.throttle.warning("dead retry", "dead-lettering %s failed (%s); trying it again later",
                                  row.id, err.str())
            self.done.retry.append((row, f"dead-letter topic: {err.name()}: {err.str()}",
                                    retry_delay_ms(row.attempts)))

    # -- failures and shutdown -----------------------------------------------------------------

    def look_after_producer(self) -> None:
        """Replace the producer when `ProducerWatch` says it is at fault or has stalled, and serve what
        replaced producers still have to report. Between delivery reports, never inside one."""
        self.take_reports()  # what they say about the producer first
        now = time.monotonic()
        self.watch.working(self.shared.in_flight > 0, now)
        why = self.watch.due(now)
        if why is not None:
            self.replace_producer(why, now)
        self.serve_retired()
        self.take_reports()  # the purged publishes of the producers replaced

    def serve_retired(self) -> None:
        """Serve the reports replaced producers still owe; drop each once it owes none."""
        if self.retired:
            self.retired = [old for old in self.retired if old.flush(0)]

    def replace_producer(self, why: str, now: float) -> None:
        """A new producer; the old one's unacknowledged publishes are purged and their rows handed back
        (or kept, if acknowledged after all) as their reports come."""
        old = self.producer
        self.generation += 1
        self.watch.replaced(why, now)
        self.producer, self.outage = self.producers()
        if retire(old):
            self.retired.append(old)

    def shutdown(self) -> None:
        """Stop claiming (a claim running is cancelled), hand back what was not published, wait for
        acknowledgements, delete what was fired."""
        self.claimer.stop()
        if self.claimer.is_alive():
            self.claimer.join(10.0)
        self.take_claimed()
        self.done.release += self.held.take_all() + [row for row, _ in self.to_dead]
        self.to_dead = []
        self.hand_over()
        deadline = time.monotonic() + 10.0
        while self.shared.in_flight > 0 and time.monotonic() < deadline and not self.life.hard_stop:
            self.producer.poll(0.1)
            self.serve_retired()
            self.take_reports()
        # failed for good while stopping: a peer dead-letters them
        self.done.release += [row for row, _ in self.to_dead]
        self.to_dead = []
        self.hand_over()
        self.settler.inbox.put(Stop())
        self.settler.join(30.0)
        self.take_claimed()  # claimed after the stop was asked (a claim that would not end): hand those back too
        self.release_leftovers(self.held.take_all())
        log.info("stopping: claimed %(claimed)d, fired %(fired)d, vanished %(vanished)d, handed back %(released)d "
                 "(held too long: %(expired)d), retried later %(retried)d, dead-lettered %(dead)d, parked %(parked)d",
                 self.shared.totals.as_dict())
        self.metrics.close()

    def release_leftovers(self, rows: list[Claimed]) -> None:
        """Hand back rows claimed after the settling thread was told to stop, on a store of this
        thread's own; if the settling thread has not ended, leave them to the detector."""
        if not rows:
            return
        if self.settler.is_alive():
            log.warning("the store thread has not ended: %d held rows will be taken over after the hold time",
                        len(rows))
            return
        store = self.stores()
        try:
            self.shared.totals.released += store.release(rows)
        except StoreUnavailable as exc:
            log.warning("postgres unavailable at shutdown (%s): %d held rows will be taken over after the hold time",
                        exc, len(rows))
        finally:
            store.close()


def build(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> FirerProcess:
    """The firer with its real adapters: PostgreSQL stores and a confluent-kafka producer."""
    settings.require_database()  # a configuration error at start, not in the first store thread
    # a lost claim, delete or hand-back only fires a row again: no need to wait for the WAL flush
    return FirerProcess(settings, life,
                        stores=lambda: role_store(settings, node_id, "firer", synchronous_commit=False),
                        producers=lambda: make_producer(settings, "firer"),
                        telemetry=FirerTelemetry(node_id, settings))


def run(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> None:
    build(settings, node_id, life).run()
