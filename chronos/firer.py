"""`chronos firer`: store → output topic at each message's deadline.

Claims due rows (and rows due within the lookahead) in batches with one
`UPDATE ... RETURNING`, publishes each from memory at its deadline less the measured
publish latency (never more than the timing advance), waits for Kafka's acknowledgement,
then deletes exactly the acknowledged rows it still owns. Unpublished rows are handed back
on shutdown; a row whose publish failed is handed back at once so any firer retries it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
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


class PublishTiming:
    """When to publish a row so that it lands on the output topic at its deadline.

    `offset_us` is the database clock minus the local clock (deadlines are in database time);
    `latency` is a moving average of produce→acknowledgement time, used as the advance, capped
    at the configured timing advance so nothing is ever published earlier than that.
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
        return min(self.latency, self.cap)

    def local_deadline(self, deadline_us: int) -> float:
        """The deadline (database time) on the local wall clock, in seconds."""
        return (deadline_us - self.offset_us) / 1e6


class FirerProcess:
    def __init__(self, settings: Settings, node_id: uuid.UUID, life: Lifecycle):
        self.settings, self.node_id, self.life = settings, node_id, life
        self.store = Store(settings.database_url, node_id=node_id)
        self.producer, self.outage = make_producer(settings, "firer")
        self.timing = PublishTiming(settings.timing_advance_ms)
        self.throttle = Throttle(log)
        self.db_backoff = Backoff()
        self.limit = settings.batch_size
        self.max_outstanding = settings.batch_size * 4
        self.heap: list[tuple[float, int, int, Claimed]] = []
        self.seq = itertools.count()
        self.in_flight = 0
        self.ack_progress = 0.0  # monotonic: the last acknowledgement, or the first publish since none was in flight
        self.claims_paused = False
        self.acked: list[Claimed] = []
        self.failed: list[Claimed] = []
        self.stats = {"claimed": 0, "fired": 0, "vanished": 0, "released": 0}
        self.next_claim = 0.0
        self.next_schedules = 0.0
        self.next_clock_sync = 0.0
        self.last_delete = 0.0
        self.db_down_until = 0.0
        self.metrics = FirerTelemetry(node_id, settings)
        self.metrics.follow(lambda: self.stats)
        self.metrics.follow_timing(lambda: len(self.heap) + self.in_flight, self.timing)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        log.info("firing from the store to %s: batch %d, lookahead %d ms, poll %d ms, timing advance %d ms",
                 self.settings.output_topic, self.limit, self.settings.lookahead_ms,
                 self.settings.poll_interval_ms, self.settings.timing_advance_ms)
        self.metrics.serve(postgres=lambda: self.store.last_ok, kafka=lambda: self.producer,
                           kafka_topic=self.settings.output_topic)
        try:
            while self.life.running:
                now = time.time()
                self.metrics.beat()
                if now >= self.next_clock_sync and now >= self.db_down_until:
                    self.sync_clock()
                if now >= self.next_claim and now >= self.db_down_until:
                    self.claim(now)
                self.publish_due()
                self.producer.poll(0)
                self.settle()
                self.producer.poll(self.wait_time())
        finally:
            self.shutdown()

    def wait_time(self) -> float:
        now = time.time()
        wake = max(self.next_claim, self.db_down_until)
        if self.heap:
            wake = min(wake, self.heap[0][0] - self.timing.advance)
        if self.acked or self.failed:
            wake = min(wake, self.last_delete + DELETE_EVERY)
        return max(0.0, min(wake - now, 1.0))

    def claim(self, now: float) -> None:
        stalled = time.monotonic() - self.ack_progress if self.in_flight else 0.0
        if stalled > self.settings.hold_time_ms / 2000.0:
            # Kafka does not acknowledge: rows claimed now would only wait, be handed to a peer after the
            # hold time and be published again by it, over and over; claim nothing until Kafka answers
            if not self.claims_paused:
                self.claims_paused = True
                log.warning("no acknowledgement from Kafka for %.1fs: claiming nothing until there is one", stalled)
            self.next_claim = now + 0.05
            return
        if self.claims_paused:
            self.claims_paused = False
            log.warning("Kafka acknowledges again: claiming rows")
        outstanding = len(self.heap) + self.in_flight
        if outstanding >= self.max_outstanding:
            self.next_claim = now + 0.005  # wait for acknowledgements before claiming more
            return
        limit = min(self.limit, self.max_outstanding - outstanding)
        started = time.perf_counter()
        try:
            rows = self.store.claim(limit, self.settings.lookahead_ms)
            occurrences = []
            if now >= self.next_schedules:  # recurring schedules: once per poll interval, even in a backlog
                self.next_schedules = now + self.settings.poll_interval_ms / 1000.0
                occurrences = self.store.claim_schedules(limit, self.settings.lookahead_ms, time.time_ns() // 1000)
        except StoreUnavailable as exc:
            self.store_failed(exc)
            return
        self.store_ok()
        self.metrics.batch("claim", len(rows) + len(occurrences), time.perf_counter() - started)
        # deadline, then enqueue order: rows of one ordering key are published in that order
        for row in rows + occurrences:
            heapq.heappush(self.heap, (self.timing.local_deadline(row.deadline_us), row.seq, next(self.seq), row))
        self.stats["claimed"] += len(rows) + len(occurrences)
        if len(rows) == limit:
            self.next_claim = now  # a backlog: drain it without sleeping
        else:
            interval = self.settings.poll_interval_ms / 1000.0
            self.next_claim = now + interval * random.uniform(0.9, 1.1)

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
        produce(self.producer, row.topic or self.settings.output_topic, row.value, row.key,
                codec.decode_headers(row.headers), delivered)

    def settle(self) -> None:
        """Delete acknowledged rows and hand back failed ones, in batches."""
        now = time.time()
        if not (self.acked or self.failed) or now < self.db_down_until:
            return
        if len(self.acked) < DELETE_BATCH and now - self.last_delete < DELETE_EVERY:
            return
        self.last_delete = now
        try:
            while self.acked:
                done, self.acked = self.acked[:DELETE_BATCH], self.acked[DELETE_BATCH:]
                try:
                    started = time.perf_counter()
                    deleted = self.store.delete_fired(done)
                except StoreUnavailable:
                    self.acked = done + self.acked
                    raise
                self.metrics.batch("delete", len(done), time.perf_counter() - started)
                self.stats["fired"] += len(done)
                if deleted < len(done):
                    self.stats["vanished"] += len(done) - deleted
                    self.throttle.warning("vanished", "%d published rows were no longer ours to delete "
                                          "(taken over by a peer after the hold time)", len(done) - deleted)
            if self.failed:
                self.stats["released"] += self.store.release(self.failed)
                self.failed = []
            self.store_ok()
        except StoreUnavailable as exc:
            self.store_failed(exc)
        self.outage.ok()

    def sync_clock(self) -> None:
        self.next_clock_sync = time.time() + CLOCK_SYNC_EVERY
        try:
            if self.store.conn is None or self.store.conn.closed:
                self.store.db_clock_us()  # connect first: a connect inside the measurement skews it
            before = time.time()
            db_us = self.store.db_clock_us()
            self.timing.observe_clock(db_us, before, time.time())
        except StoreUnavailable as exc:
            self.store_failed(exc)

    # -- failures ----------------------------------------------------------------------------

    def store_failed(self, exc: StoreUnavailable) -> None:
        delay = self.db_backoff.failed()
        self.throttle.warning("db", "postgres unavailable (%s); retrying in %.1fs", exc, delay)
        self.db_down_until = time.time() + delay

    def store_ok(self) -> None:
        lasted = self.db_backoff.succeeded()
        if lasted is not None:
            log.warning("postgres reachable again after %.1fs", lasted)

    def replace_producer(self) -> None:
        log.error("the producer hit a fatal error; replacing it (in-flight rows are handed back)")
        self.producer, self.outage = make_producer(self.settings, "firer")
        self.in_flight = 0  # the old producer's rows stay claimed; the detector hands them back

    def shutdown(self) -> None:
        """Hand back what was not published, wait for acknowledgements, delete what was fired."""
        unpublished = [entry[-1] for entry in self.heap]
        self.heap.clear()
        deadline = time.monotonic() + 10.0
        while self.in_flight > 0 and time.monotonic() < deadline and not self.life.hard_stop:
            self.producer.poll(0.1)
        try:
            if self.acked:
                self.store.delete_fired(self.acked)
                self.stats["fired"] += len(self.acked)
            released = self.store.release(unpublished + self.failed)
            self.stats["released"] += released
        except StoreUnavailable as exc:
            log.warning("postgres unavailable at shutdown (%s): claimed rows will be taken over after the "
                        "hold time", exc)
        log.info("stopping: claimed %(claimed)d, fired %(fired)d, vanished %(vanished)d, handed back %(released)d",
                 self.stats)
        self.metrics.close()
        self.store.close()


def run(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> None:
    FirerProcess(settings, node_id, life).run()
