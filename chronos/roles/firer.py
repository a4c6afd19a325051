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
"""

from __future__ import annotations

import heapq
from collections import deque
import itertools
import logging
import queue
import random
import threading
import time
import uuid
from typing import Callable

from chronos import codec
from chronos.config import Settings
from chronos.errors import StoreUnavailable
from chronos.adapters.kafka import (PERMANENT_FAILURE, UNANSWERED_FAILURE, OutageLog, classify, dead_letter_headers,
                                    failure_reason, make_producer, produce)
from chronos.runtime.logs import Throttle
from chronos.ops.metrics import FirerTelemetry
from chronos.runtime.process import Lifecycle
from chronos.runtime.backoff import Outage
from chronos.domain.model import Claimed
from chronos.adapters.postgres.store import Store as PostgresStore
from chronos.ports import Publisher, Store

log = logging.getLogger("chronos.firer")

DELETE_BATCH = 1000          # acknowledged rows deleted in one statement at most
DELETE_EVERY = 0.02          # seconds between deletes while acknowledgements trickle in
CLOCK_SYNC_EVERY = 10.0      # seconds between measurements of the database clock offset
IDLE_WAIT = 0.005            # the publishing thread looks for newly claimed rows this often
SLOW_STATEMENT = 1.0         # seconds: a claim or delete slower than this is logged (aggregated)
TICK = 0.001                 # the publishing thread sleeps at least this long: rows due within it go together
RETRY_FIRST_MS = 1000        # backoff after a row's first refused publish; doubled after each further one
RETRY_CAP_MS = 60_000        # and never longer than this

RELEASE, RETRY, DEAD = "release", "retry", "dead"


def retry_delay_ms(failures_before: int) -> int:
    """How long a row waits before its next publish, given how many of its publishes failed before
    this one: 1 s, 2 s, 4 s, ... up to a minute."""
    return min(RETRY_CAP_MS, RETRY_FIRST_MS << min(failures_before, 16))


def after_failure(kind: str, failures: int, max_attempts: int) -> str:
    """What to do with a row whose publish failed (`kind` from `kafka.classify`; `failures`
    counts this one): dead-letter it, retry it after a backoff, or hand it back as it is (Kafka
    did not answer: that says nothing about the message, and the firer stops claiming meanwhile)."""
    if kind == PERMANENT_FAILURE:
        return DEAD
    if kind == UNANSWERED_FAILURE:
        return RELEASE
    return DEAD if failures >= max_attempts else RETRY


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


class StoreThread(threading.Thread):
    """A thread of the firer that talks to PostgreSQL, on its own `Store` and connection (a Store
    is not thread-safe: one per thread). psycopg releases the GIL while it waits on the network,
    so no statement of these threads delays a publish that is due."""

    def __init__(self, firer: "FirerProcess", name: str):
        super().__init__(name=name, daemon=True)
        self.firer = firer
        self.settings = firer.settings
        self.store: Store = firer.stores()
        self.throttle = Throttle(log)
        self.outage = Outage(log)
        self.crashed: BaseException | None = None

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as exc:  # noqa: BLE001 - the process stops as a whole when this thread dies
            log.exception("the %s thread failed; stopping the firer", self.name)
            self.crashed = exc
            self.firer.life.stop()

    def loop(self) -> None:
        raise NotImplementedError

    def measured(self, step: str, rows: int, started: float) -> None:
        """Record a statement's duration; one slow enough to hold up firing is also logged, since
        while a claim runs nothing more is claimed, and while a delete runs held rows age towards the
        hold time."""
        elapsed = time.perf_counter() - started
        self.firer.metrics.batch(step, rows, elapsed)
        if elapsed > SLOW_STATEMENT:
            self.throttle.warning("slow " + step, "slow %s: %.1fs for %d rows (%d rows held by this firer)",
                                  step, elapsed, rows, self.firer.held())


class Claimer(StoreThread):
    """Claims due rows and recurring schedules. On a thread and connection of its own, apart from
    the deletes and hand-backs (`StoreWorker`): a claim that runs long (a lock, a plan gone bad)
    stops only further claims, and the rows already held keep being deleted once published, so
    none of them ages past the hold time into a peer's hands."""

    def __init__(self, firer: "FirerProcess"):
        super().__init__(firer, "firer-claim")
        self.limit = firer.settings.batch_size
        self.limits = firer.settings.fire_rates
        if self.limits:
            log.info("fire-rate limits: %s", self.limits)
        self.max_held = firer.settings.batch_size * 4
        self.claimed_rows = 0        # ever claimed (this thread writes it; `FirerProcess.held` reads it)
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
        firer = self.firer
        # Kafka does not acknowledge, or acknowledges so slowly that publishes wait for seconds (an
        # overloaded broker): rows claimed now would only wait, be handed to a peer after the hold time
        # and be published again by it, over and over; claim nothing until Kafka catches up
        stalled = time.monotonic() - firer.ack_progress if firer.in_flight else 0.0
        stalled = max(stalled, firer.publish_age())
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
        held = firer.held()
        if held >= self.max_held:
            self.next_claim = now + 0.005  # wait for acknowledgements before claiming more
            return
        limit = min(self.limit, self.max_held - held)
        started = time.perf_counter()
        if self.limits:  # fire-rate limits: topic by topic, within each limited topic's budget
            rows, backlog = self.store.claim_limited(self.limits, self.settings.output_topic, limit,
                                                     self.settings.lookahead_ms)
        else:
            rows = self.store.claim(limit, self.settings.lookahead_ms)
            backlog = len(rows) == limit
        self.hand_to_publisher(rows)  # before the schedules' claim, which may be the slow one
        occurrences = []
        if now >= self.next_schedules:  # recurring schedules: once per poll interval, even in a backlog
            self.next_schedules = now + self.settings.poll_interval_ms / 1000.0
            occurrences = self.store.claim_schedules(limit, self.settings.lookahead_ms, time.time_ns() // 1000)
            self.hand_to_publisher(occurrences)
        self.measured("claim", len(rows) + len(occurrences), started)
        if backlog:
            self.next_claim = now  # a backlog: drain it without sleeping
        else:
            interval = self.settings.poll_interval_ms / 1000.0
            self.next_claim = now + interval * random.uniform(0.9, 1.1)

    def hand_to_publisher(self, rows: list[Claimed]) -> None:
        if rows:
            self.claimed_rows += len(rows)
            self.firer.stats["claimed"] += len(rows)
            self.firer.claimed.put(rows)


class StoreWorker(StoreThread):
    """Deletes the acknowledged rows, hands back failed ones and measures the database clock, on
    its own thread and connection: never behind a claim (`Claimer`)."""

    def __init__(self, firer: "FirerProcess"):
        super().__init__(firer, "firer-store")
        self.inbox: queue.SimpleQueue[tuple[str, list[Claimed]]] = queue.SimpleQueue()
        self.settled_rows = 0        # ever deleted or handed back (this thread writes it)
        self.acked: list[Claimed] = []
        self.release: list[Claimed] = []
        self.retry: list[tuple[Claimed, str, int]] = []   # (row, error, delay_ms): refused, to try again later
        self.dead: list[tuple[Claimed, str]] = []         # (row, reason): on the dead-letter topic, to delete
        self.park: list[tuple[Claimed, str]] = []         # (row, reason): refused by the dead-letter topic too
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
                    if not (self.acked or self.pending()):
                        return
                    continue
                if now >= self.next_clock_sync:
                    self.sync_clock(now)
                self.outage.ok()
            except StoreUnavailable as exc:
                if self.stopping and self.outage.down_for() > 5:
                    log.warning("postgres unavailable at shutdown (%s): %d claimed rows will be taken over "
                                "after the hold time", exc, len(self.acked) + len(self.release) + len(self.retry)
                                + len(self.dead) + len(self.park))
                    return
                self.down_until = time.time() + self.outage.failed(exc)

    def wait_time(self) -> float:
        now = time.time()
        if now < self.down_until:  # PostgreSQL is away: nothing to do before the next try
            return min(self.down_until - now, 1.0)
        wake = now + 1.0 if self.stopping else self.next_clock_sync
        if self.acked:
            wake = min(wake, self.last_delete + DELETE_EVERY)
        if self.pending() or (self.stopping and self.acked):
            wake = now
        return max(0.0, min(wake - now, 1.0))

    def pending(self) -> bool:
        """Rows to hand back, retry later, delete as dead-lettered or park: settled at once."""
        return bool(self.release or self.retry or self.dead or self.park)

    def receive(self, timeout: float) -> None:
        """Take what the publishing thread sent: acknowledged, failed and dead-lettered rows, stop."""
        try:
            item = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, rows = item
            if kind == "stop":
                self.stopping = True
            else:
                getattr(self, kind).extend(rows)  # acked, release, retry, dead or park
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def settle(self, now: float) -> None:
        """Delete acknowledged rows in batches, hand back rows that will not be published, and settle
        failed ones: retried later, deleted once dead-lettered, or parked."""
        stats = self.firer.stats
        if self.release:
            rows = self.release
            stats["released"] += self.store.release(rows)
            self.settled_rows += len(rows)
            self.release = []
        if self.retry:
            stats["retried"] += self.store.retry_later(self.retry)
            self.settled_rows += len(self.retry)
            self.retry = []
        if self.dead:
            stats["dead"] += self.store.delete_fired([row for row, _ in self.dead])
            self.firer.metrics.dead_lettered(reason for _, reason in self.dead)
            self.settled_rows += len(self.dead)
            self.dead = []
        if self.park:
            stats["parked"] += self.store.park_claimed(self.park, self.settings.output_topic)
            for row, reason in self.park:
                log.warning("parked %s in chronos_parked: neither %s nor the dead-letter topic %s took it (%s)",
                            row.id, row.topic or self.settings.output_topic, self.settings.dlq_topic, reason)
            self.settled_rows += len(self.park)
            self.park = []
        if not self.acked or (len(self.acked) < DELETE_BATCH and now - self.last_delete < DELETE_EVERY
                              and not self.stopping):
            return
        self.last_delete = now
        while self.acked:
            done = self.acked[:DELETE_BATCH]
            started = time.perf_counter()
            deleted = self.store.delete_fired(done)
            del self.acked[:DELETE_BATCH]
            self.settled_rows += len(done)
            self.measured("delete", len(done), started)
            self.firer.stats["fired"] += len(done)
            if deleted < len(done):
                self.firer.stats["vanished"] += len(done) - deleted
                self.throttle.warning("vanished", "%d published rows were no longer ours to delete "
                                      "(taken over by a peer after the hold time)", len(done) - deleted)

    def sync_clock(self, now: float) -> None:
        self.next_clock_sync = now + CLOCK_SYNC_EVERY
        self.store.db_clock_us()  # (re)connect first if need be: a connect inside the measurement skews it
        before = time.time()
        db_us = self.store.db_clock_us()
        self.firer.timing.observe_clock(db_us, before, time.time())


class FirerProcess:
    """The publishing thread: keeps claimed rows in a heap by deadline and publishes each on time."""

    def __init__(self, settings: Settings, life: Lifecycle, *, stores: Callable[[], Store],
                 producers: Callable[[], tuple[Publisher, OutageLog]], telemetry: FirerTelemetry):
        """`stores` makes one store per thread (a store is one connection, not thread-safe);
        `producers` makes a Kafka producer and the log of its outages, again after a fatal error."""
        self.settings, self.life = settings, life
        self.stores, self.producers = stores, producers
        self.producer, self.outage = producers()
        self.timing = PublishTiming(settings.timing_advance_ms)
        self.throttle = Throttle(log)
        self.claimed: queue.SimpleQueue[list[Claimed]] = queue.SimpleQueue()
        self.heap: list[tuple[float, int, int, Claimed]] = []
        self.seq = itertools.count()
        self.in_flight = 0
        self.ack_progress = 0.0  # monotonic: the last acknowledgement, or the first publish since none was in flight
        self.sent_at: deque[float] = deque()  # monotonic send time of each publish in flight, oldest first
        self.acked: list[Claimed] = []
        self.failed: list[Claimed] = []
        self.retry: list[tuple[Claimed, str, int]] = []
        self.to_dead: list[tuple[Claimed, str]] = []      # to publish on the dead-letter topic
        self.dead: list[tuple[Claimed, str]] = []         # acknowledged by the dead-letter topic
        self.park: list[tuple[Claimed, str]] = []
        self.allowed = settings.allowed_topics_re
        self.stats = {"claimed": 0, "fired": 0, "vanished": 0, "released": 0, "retried": 0, "dead": 0, "parked": 0}
        self.metrics = telemetry
        self.worker = StoreWorker(self)
        self.claimer = Claimer(self)
        self.store = self.worker.store
        self.metrics.follow(lambda: self.stats)
        self.metrics.follow_timing(lambda: len(self.heap) + self.in_flight, self.timing)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        log.info("firing from the store to %s: batch %d, lookahead %d ms, poll %d ms, timing advance %d ms",
                 self.settings.output_topic, self.settings.batch_size, self.settings.lookahead_ms,
                 self.settings.poll_interval_ms, self.settings.timing_advance_ms)
        self.metrics.serve(postgres=lambda: max(self.store.last_ok, self.claimer.store.last_ok),
                           kafka=lambda: self.producer, kafka_topic=self.settings.output_topic)
        self.worker.start()
        self.claimer.start()
        try:
            while self.life.running:
                self.metrics.beat()
                self.take_claimed()
                self.publish_due()
                self.send_dead()
                self.producer.poll(self.wait_time())
                self.hand_over()
        finally:
            self.shutdown()
        for thread in (self.worker, self.claimer):
            if thread.crashed is not None:
                raise RuntimeError(f"the firer's {thread.name} thread failed") from thread.crashed

    def held(self) -> int:
        """Rows claimed by this node and not yet deleted or handed back."""
        return self.claimer.claimed_rows - self.worker.settled_rows

    def take_claimed(self) -> None:
        while True:
            try:
                rows = self.claimed.get_nowait()
            except queue.Empty:
                return
            # deadline, then enqueue order: rows of one ordering key are published in that order
            for row in rows:
                # by the deadline as scheduled: a retried row goes out as soon as its backoff let it be
                # claimed, ahead of the later rows of its key claimed with it
                heapq.heappush(self.heap, (self.timing.local_deadline(row.scheduled_us), row.seq, next(self.seq), row))

    def wait_time(self) -> float:
        """Until the next publish is due; new claims are looked at every few milliseconds. Never
        less than a tick: at 1,000 msg/s deadlines are a millisecond apart, and waking for each one
        (librdkafka's poll rounds a sub-millisecond wait down to none) spun a whole core."""
        wait = IDLE_WAIT
        if self.heap:
            wait = min(wait, self.heap[0][0] - self.timing.advance - time.time())
        return max(TICK, wait)

    def publish_age(self) -> float:
        """How long the oldest publish in flight has waited for its acknowledgement (read by the
        store thread). Acknowledgements come back about in publish order, so one is dropped from
        the front per acknowledgement."""
        try:
            return time.monotonic() - self.sent_at[0]
        except IndexError:
            return 0.0

    def hand_over(self) -> None:
        """Send acknowledged, failed and dead-lettered rows to the store thread."""
        if self.acked:
            self.worker.inbox.put(("acked", self.acked))
            self.acked = []
            self.outage.ok()
        if self.failed:
            self.worker.inbox.put(("release", self.failed))
            self.failed = []
        for kind in ("retry", "dead", "park"):
            rows = getattr(self, kind)
            if rows:
                self.worker.inbox.put((kind, rows))
                setattr(self, kind, [])

    def publish_due(self) -> None:
        if not self.heap:
            return
        horizon = time.time() + self.timing.advance
        started, before = time.perf_counter(), len(self.heap)
        while self.heap and self.heap[0][0] <= horizon:
            row = heapq.heappop(self.heap)[-1]
            self.publish(row)
        if len(self.heap) < before:
            self.metrics.batch("publish", before - len(self.heap), time.perf_counter() - started)

    def publish(self, row: Claimed) -> None:
        # the allow-list in force now, not the one the message was accepted under
        if row.topic is not None and row.topic != self.settings.output_topic and not self.allowed.fullmatch(row.topic):
            self.to_dead.append((row, f"topic_not_allowed: {row.topic!r} does not match CHRONOS_ALLOWED_TOPICS"))
            return
        sent = time.monotonic()

        def delivered(err, _msg):
            self.delivered()
            if err is None:
                self.timing.observe_ack(time.monotonic() - sent)
                self.metrics.lateness.observe(time.time() - self.timing.local_deadline(row.scheduled_us))
                self.acked.append(row)
            else:
                self.publish_failed(row, err)

        self.sending(sent)
        produce(self.producer, row.topic or self.settings.output_topic, row.value, row.key,
                codec.decode_headers(row.headers), delivered)

    def sending(self, sent: float) -> None:
        if not self.in_flight:
            self.ack_progress = time.monotonic()
        self.in_flight += 1
        self.sent_at.append(sent)

    def delivered(self) -> None:
        self.in_flight -= 1
        if self.sent_at:
            self.sent_at.popleft()
        self.ack_progress = time.monotonic()

    def publish_failed(self, row: Claimed, err) -> None:
        """The one path of a failed publish, whether librdkafka refused it in `produce()` or in the
        delivery report: hand it back, retry it after a backoff, or dead-letter it."""
        failures = row.attempts + 1
        action = after_failure(classify(err), failures, self.settings.max_publish_attempts)
        topic = row.topic or self.settings.output_topic
        if action == RELEASE:
            self.throttle.warning("publish", "publish of %s failed: %s; handing it back", row.id, err.str())
            self.failed.append(row)
        elif action == RETRY:
            delay = retry_delay_ms(row.attempts)
            self.throttle.warning("retry", "publish of %s to %s failed (%s): attempt %d of %d, next in %.1fs",
                                  row.id, topic, err.str(), failures, self.settings.max_publish_attempts,
                                  delay / 1000)
            self.retry.append((row, f"{err.name()}: {err.str()}", delay))
        else:
            reason = failure_reason(err)
            if classify(err) != PERMANENT_FAILURE:
                reason += f" ({failures} attempts)"
            self.throttle.warning("dead", "publish of %s to %s failed for good: %s; to the dead-letter topic",
                                  row.id, topic, reason)
            self.to_dead.append((row, reason))
        if err.fatal():
            self.replace_producer()

    def send_dead(self) -> None:
        """Publish the rows to dead-letter, each with its original id, deadline (as scheduled) and
        destination, plus chronosError and chronosSource `store/<id>`."""
        pending, self.to_dead = self.to_dead, []
        for row, reason in pending:
            headers = [("chronosMessageId", row.id.encode()), ("chronosDeadline", iso_us(row.scheduled_us).encode())]
            if row.topic is not None:
                headers.append(("chronosTopic", row.topic.encode()))
            headers = dead_letter_headers(headers + codec.decode_headers(row.headers), reason, f"store/{row.id}")

            def delivered(err, _msg, row=row, reason=reason):
                self.delivered()
                if err is None:
                    self.dead.append((row, reason))
                elif classify(err) == PERMANENT_FAILURE:
                    self.park.append((row, f"{reason}; dead-letter topic: {err.name()}: {err.str()}"))
                elif classify(err) == UNANSWERED_FAILURE:
                    self.failed.append(row)
                else:  # the dead-letter topic refuses for now: the whole row is tried again after a backoff
                    self.throttle.warning("dead retry", "dead-lettering %s failed (%s); trying it again later",
                                          row.id, err.str())
                    self.retry.append((row, f"dead-letter topic: {err.name()}: {err.str()}",
                                       retry_delay_ms(row.attempts)))
                if err is not None and err.fatal():
                    self.replace_producer()

            self.sending(time.monotonic())
            produce(self.producer, self.settings.dlq_topic, row.value, row.key, headers, delivered)

    # -- failures and shutdown -----------------------------------------------------------------

    def replace_producer(self) -> None:
        log.error("the producer hit a fatal error; replacing it (in-flight rows are handed back)")
        self.producer, self.outage = self.producers()
        self.in_flight = 0  # the old producer's rows stay claimed; the detector hands them back
        self.sent_at.clear()

    def shutdown(self) -> None:
        """Stop claiming (a claim running is cancelled), hand back what was not published, wait for
        acknowledgements, delete what was fired."""
        self.claimer.stop()
        if self.claimer.is_alive():
            self.claimer.join(10.0)
        self.take_claimed()
        unpublished = [entry[-1] for entry in self.heap] + [row for row, _ in self.to_dead]
        self.heap.clear()
        self.to_dead = []
        self.worker.inbox.put(("release", unpublished))
        deadline = time.monotonic() + 10.0
        while self.in_flight > 0 and time.monotonic() < deadline and not self.life.hard_stop:
            self.producer.poll(0.1)
        self.failed.extend(row for row, _ in self.to_dead)  # failed for good while stopping: a peer dead-letters them
        self.to_dead = []
        self.hand_over()
        self.worker.inbox.put(("stop", []))
        self.worker.join(30.0)
        self.take_claimed()  # claimed after the stop was asked (a claim that would not end): hand those back too
        leftover = [entry[-1] for entry in self.heap]
        if leftover:
            try:
                self.stats["released"] += self.store.release(leftover)
            except StoreUnavailable as exc:
                log.warning("postgres unavailable at shutdown (%s): claimed rows will be taken over after "
                            "the hold time", exc)
        log.info("stopping: claimed %(claimed)d, fired %(fired)d, vanished %(vanished)d, handed back %(released)d, "
                 "retried later %(retried)d, dead-lettered %(dead)d, parked %(parked)d", self.stats)
        self.metrics.close()
        self.store.close()
        self.claimer.store.close()


def build(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> FirerProcess:
    """The firer with its real adapters: PostgreSQL stores and a confluent-kafka producer."""
    url = settings.require_database()
    # a lost claim, delete or hand-back only fires a row again: no need to wait for the WAL flush
    return FirerProcess(settings, life,
                        stores=lambda: PostgresStore(url, node_id=node_id, hot_path=True, synchronous_commit=False),
                        producers=lambda: make_producer(settings, "firer"),
                        telemetry=FirerTelemetry(node_id, settings))


def run(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> None:
    build(settings, node_id, life).run()
