"""`chronos firer`: store → output topic at each message's deadline.

Claims due rows (and rows due within the lookahead) in batches with one
`UPDATE ... RETURNING`, publishes each from memory at its deadline less the measured
publish latency (never more than the timing advance), waits for Kafka's acknowledgement,
then deletes exactly the acknowledged rows it still owns. Unpublished rows are handed back
on shutdown; a row whose publish failed is handed back at once so any firer retries it.
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

from chronos import codec
from chronos.config import Settings
from chronos.errors import StoreUnavailable
from chronos.kafka import make_producer, produce
from chronos.logs import Throttle
from chronos.metrics import FirerTelemetry
from chronos.runtime import Lifecycle
from chronos.store import Backoff, Claimed, Store

log = logging.getLogger("chronos.firer")

DELETE_BATCH = 1000          # acknowledged rows deleted in one statement at most
DELETE_EVERY = 0.02          # seconds between deletes while acknowledgements trickle in
CLOCK_SYNC_EVERY = 10.0      # seconds between measurements of the database clock offset
IDLE_WAIT = 0.005            # the publishing thread looks for newly claimed rows this often
SLOW_STATEMENT = 1.0         # seconds: a claim or delete slower than this is logged (aggregated)
TICK = 0.001                 # the publishing thread sleeps at least this long: rows due within it go together


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


class StoreWorker(threading.Thread):
    """The firer's PostgreSQL side, on its own thread and connection: claims rows, deletes the
    acknowledged ones, hands back failed ones, measures the database clock.

    Kept off the publishing thread so that a slow claim or delete never delays a publish that
    is due: psycopg releases the GIL while it waits on the network.
    """

    def __init__(self, firer: "FirerProcess"):
        super().__init__(name="firer-store", daemon=True)
        self.firer = firer
        self.settings = firer.settings
        self.store = Store(firer.settings.database_url, node_id=firer.node_id)
        self.inbox: queue.SimpleQueue[tuple[str, list[Claimed]]] = queue.SimpleQueue()
        self.throttle = Throttle(log)
        self.backoff = Backoff()
        self.limit = firer.settings.batch_size
        self.max_held = firer.settings.batch_size * 4
        self.held = 0                # claimed by this node and not yet deleted or handed back
        self.acked: list[Claimed] = []
        self.release: list[Claimed] = []
        self.stopping = False
        self.crashed: BaseException | None = None
        self.claims_paused = False
        self.next_claim = 0.0
        self.next_schedules = 0.0
        self.next_clock_sync = 0.0
        self.last_delete = 0.0
        self.down_until = 0.0

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as exc:  # noqa: BLE001 - the process stops as a whole when this thread dies
            log.exception("the store thread failed; stopping the firer")
            self.crashed = exc
            self.firer.life.stop()

    def loop(self) -> None:
        while True:
            self.receive(self.wait_time())
            now = time.time()
            if now < self.down_until:
                continue
            try:
                self.settle(now)
                if self.stopping:
                    if not (self.acked or self.release):
                        return
                    continue
                if now >= self.next_clock_sync:
                    self.sync_clock(now)
                if now >= self.next_claim:
                    self.claim(now)
                self.store_ok()
            except StoreUnavailable as exc:
                if self.stopping and self.backoff.down_since is not None \
                        and time.monotonic() - self.backoff.down_since > 5:
                    log.warning("postgres unavailable at shutdown (%s): %d claimed rows will be taken over "
                                "after the hold time", exc, len(self.acked) + len(self.release))
                    return
                delay = self.backoff.failed()
                self.throttle.warning("db", "postgres unavailable (%s); retrying in %.1fs", exc, delay)
                self.down_until = time.time() + delay

    def wait_time(self) -> float:
        now = time.time()
        if now < self.down_until:  # PostgreSQL is away: nothing to do before the next try
            return min(self.down_until - now, 1.0)
        wake = now + 1.0 if self.stopping else self.next_claim
        if self.acked:
            wake = min(wake, self.last_delete + DELETE_EVERY)
        if self.release or (self.stopping and self.acked):
            wake = now
        return max(0.0, min(wake - now, 1.0))

    def receive(self, timeout: float) -> None:
        """Take what the publishing thread sent: acknowledged rows, rows to hand back, stop."""
        try:
            item = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, rows = item
            if kind == "acked":
                self.acked.extend(rows)
            elif kind == "release":
                self.release.extend(rows)
            else:
                self.stopping = True
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

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
        if self.held >= self.max_held:
            self.next_claim = now + 0.005  # wait for acknowledgements before claiming more
            return
        limit = min(self.limit, self.max_held - self.held)
        started = time.perf_counter()
        rows = self.store.claim(limit, self.settings.lookahead_ms)
        occurrences = []
        if now >= self.next_schedules:  # recurring schedules: once per poll interval, even in a backlog
            self.next_schedules = now + self.settings.poll_interval_ms / 1000.0
            occurrences = self.store.claim_schedules(limit, self.settings.lookahead_ms, time.time_ns() // 1000)
        self.measured("claim", len(rows) + len(occurrences), started)
        if rows or occurrences:
            self.held += len(rows) + len(occurrences)
            firer.stats["claimed"] += len(rows) + len(occurrences)
            firer.claimed.put(rows + occurrences)
        if len(rows) == limit:
            self.next_claim = now  # a backlog: drain it without sleeping
        else:
            interval = self.settings.poll_interval_ms / 1000.0
            self.next_claim = now + interval * random.uniform(0.9, 1.1)

    def measured(self, step: str, rows: int, started: float) -> None:
        """Record a statement's duration; one slow enough to hold up firing is also logged, since
        while it runs nothing is claimed or deleted and held rows age towards the hold time."""
        elapsed = time.perf_counter() - started
        self.firer.metrics.batch(step, rows, elapsed)
        if elapsed > SLOW_STATEMENT:
            self.throttle.warning("slow " + step, "slow %s: %.1fs for %d rows (%d rows held by this firer)",
                                  step, elapsed, rows, self.held)

    def settle(self, now: float) -> None:
        """Delete acknowledged rows in batches, and hand back rows that will not be published."""
        if self.release:
            rows = self.release
            self.firer.stats["released"] += self.store.release(rows)
            self.held -= len(rows)
            self.release = []
        if not self.acked or (len(self.acked) < DELETE_BATCH and now - self.last_delete < DELETE_EVERY
                              and not self.stopping):
            return
        self.last_delete = now
        while self.acked:
            done = self.acked[:DELETE_BATCH]
            started = time.perf_counter()
            deleted = self.store.delete_fired(done)
            del self.acked[:DELETE_BATCH]
            self.held -= len(done)
            self.measured("delete", len(done), started)
            self.firer.stats["fired"] += len(done)
            if deleted < len(done):
                self.firer.stats["vanished"] += len(done) - deleted
                self.throttle.warning("vanished", "%d published rows were no longer ours to delete "
                                      "(taken over by a peer after the hold time)", len(done) - deleted)

    def sync_clock(self, now: float) -> None:
        self.next_clock_sync = now + CLOCK_SYNC_EVERY
        if self.store.conn is None or self.store.conn.closed:
            self.store.db_clock_us()  # connect first: a connect inside the measurement skews it
        before = time.time()
        db_us = self.store.db_clock_us()
        self.firer.timing.observe_clock(db_us, before, time.time())

    def store_ok(self) -> None:
        lasted = self.backoff.succeeded()
        if lasted is not None:
            log.warning("postgres reachable again after %.1fs", lasted)


class FirerProcess:
    """The publishing thread: keeps claimed rows in a heap by deadline and publishes each on time."""

    def __init__(self, settings: Settings, node_id: uuid.UUID, life: Lifecycle):
        self.settings, self.node_id, self.life = settings, node_id, life
        self.producer, self.outage = make_producer(settings, "firer")
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
        self.stats = {"claimed": 0, "fired": 0, "vanished": 0, "released": 0}
        self.metrics = FirerTelemetry(node_id, settings)
        self.worker = StoreWorker(self)
        self.store = self.worker.store
        self.metrics.follow(lambda: self.stats)
        self.metrics.follow_timing(lambda: len(self.heap) + self.in_flight, self.timing)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        log.info("firing from the store to %s: batch %d, lookahead %d ms, poll %d ms, timing advance %d ms",
                 self.settings.output_topic, self.settings.batch_size, self.settings.lookahead_ms,
                 self.settings.poll_interval_ms, self.settings.timing_advance_ms)
        self.metrics.serve(postgres=lambda: self.store.last_ok, kafka=lambda: self.producer,
                           kafka_topic=self.settings.output_topic)
        self.worker.start()
        try:
            while self.life.running:
                self.metrics.beat()
                self.take_claimed()
                self.publish_due()
                self.producer.poll(self.wait_time())
                self.hand_over()
        finally:
            self.shutdown()
        if self.worker.crashed is not None:
            raise RuntimeError("the firer's store thread failed") from self.worker.crashed

    def take_claimed(self) -> None:
        while True:
            try:
                rows = self.claimed.get_nowait()
            except queue.Empty:
                return
            # deadline, then enqueue order: rows of one ordering key are published in that order
            for row in rows:
                heapq.heappush(self.heap, (self.timing.local_deadline(row.deadline_us), row.seq, next(self.seq), row))

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
        """Send acknowledged and failed rows to the store thread."""
        if self.acked:
            self.worker.inbox.put(("acked", self.acked))
            self.acked = []
            self.outage.ok()
        if self.failed:
            self.worker.inbox.put(("release", self.failed))
            self.failed = []

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
        sent = time.monotonic()

        def delivered(err, _msg):
            self.in_flight -= 1
            if self.sent_at:
                self.sent_at.popleft()
            self.ack_progress = time.monotonic()
            if err is None:
                self.timing.observe_ack(time.monotonic() - sent)
                self.metrics.lateness.observe(time.time() - self.timing.local_deadline(row.deadline_us))
                self.acked.append(row)
            else:
                self.throttle.warning("publish", "publish of %s failed: %s; handing it back", row.id, err.str())
                self.failed.append(row)
                if err.fatal():
                    self.replace_producer()

        if not self.in_flight:
            self.ack_progress = time.monotonic()
        self.in_flight += 1
        self.sent_at.append(sent)
        produce(self.producer, row.topic or self.settings.output_topic, row.value, row.key,
                codec.decode_headers(row.headers), delivered)

    # -- failures and shutdown -----------------------------------------------------------------

    def replace_producer(self) -> None:
        log.error("the producer hit a fatal error; replacing it (in-flight rows are handed back)")
        self.producer, self.outage = make_producer(self.settings, "firer")
        self.in_flight = 0  # the old producer's rows stay claimed; the detector hands them back
        self.sent_at.clear()

    def shutdown(self) -> None:
        """Hand back what was not published, wait for acknowledgements, delete what was fired."""
        self.take_claimed()
        unpublished = [entry[-1] for entry in self.heap]
        self.heap.clear()
        self.worker.inbox.put(("release", unpublished))
        deadline = time.monotonic() + 10.0
        while self.in_flight > 0 and time.monotonic() < deadline and not self.life.hard_stop:
            self.producer.poll(0.1)
        self.hand_over()
        self.worker.inbox.put(("stop", []))
        self.worker.join(30.0)
        self.take_claimed()  # claimed by the store thread after the stop was asked: hand those back too
        leftover = [entry[-1] for entry in self.heap]
        if leftover:
            try:
                self.stats["released"] += self.store.release(leftover)
            except StoreUnavailable as exc:
                log.warning("postgres unavailable at shutdown (%s): claimed rows will be taken over after "
                            "the hold time", exc)
        log.info("stopping: claimed %(claimed)d, fired %(fired)d, vanished %(vanished)d, handed back %(released)d",
                 self.stats)
        self.metrics.close()
        self.store.close()


def run(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> None:
    FirerProcess(settings, node_id, life).run()
