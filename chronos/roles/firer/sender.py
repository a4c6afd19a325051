"""The sender: the firer's thread that publishes each held row at its deadline.

It takes the claimer's rows (`inbox`), keeps them in publishing order (`Held`), publishes each at
its deadline less the publish latency (`PublishTiming`), serves the delivery reports, dead-letters
what must be, looks after the producer (`ProducerSlot`) and sends what became of each row to the
settler (`outbox`: `Outcomes`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import time

from chronos import codec
from chronos.config import Settings
from chronos.domain import reasons
from chronos.domain.delivery import (PERMANENT_FAILURE, PRODUCER_FAILURE, AfterFailure, DeliveryError,
                                     after_failure, dead_letter_headers, failure_reason)
from chronos.domain.model import Claimed
from chronos.telemetry.metrics import FirerTelemetry
from chronos.roles.firer.decisions import TICK, retry_delay_ms
from chronos.roles.firer.handoff import Claims, Outcomes, Shared, ToSettle
from chronos.roles.firer.held import Held
from chronos.logs import Throttle
from chronos.runtime.process import Lifecycle
from chronos.runtime.producer import ProducerSlot

log = logging.getLogger("chronos.firer")

IDLE_WAIT = 0.005            # the sender looks for newly claimed rows this often


def iso_us(us: int) -> str:
    """Epoch microseconds as ISO-8601 UTC with microseconds (a chronosDeadline the consumer reads)."""
    seconds, micros = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


class Sender:
    """The sender: holds the claimed rows in deadline order (`Held`) and publishes each on time. A
    publish that fails goes through one path (`publish_failed`): handed back, retried after a
    backoff, or dead-lettered (`after_failure`). Runs on the thread that calls `FirerProcess.run`."""

    def __init__(self, settings: Settings, life: Lifecycle, slot: ProducerSlot, shared: Shared,
                 telemetry: FirerTelemetry, outbox: ToSettle):
        """`slot` holds the producer; `outbox` is the settler's inbox."""
        self.settings, self.life, self.slot, self.shared = settings, life, slot, shared
        self.timing = shared.timing
        self.metrics = telemetry
        self.throttle = Throttle(log)
        self.inbox: Claims = queue.SimpleQueue()          # claims, from the claimer
        self.outbox = outbox
        self.held = Held(settings.hold_time_ms)
        self.seq = itertools.count()
        self.done = Outcomes()                            # settled outcomes not handed to the settler yet
        self.to_dead: list[tuple[Claimed, str]] = []      # to publish on the dead-letter topic
        # delivery reports not taken yet, in the order they came: (row, sent, producer generation, the
        # dead-letter reason of a dead letter (else None), error or None); see `take_reports`
        self.reports: list[tuple[Claimed, float, int, str | None, DeliveryError | None]] = []
        self.reported = self._reported  # bound once: each publish's callback is a partial of it
        self.allowed = settings.allowed_topics_re

    def loop(self) -> None:
        """Publish until the process stops: take claims, publish what is due, dead-letter, serve the
        delivery reports while waiting for the next deadline, look after the producer, and hand the
        outcomes to the settler."""
        while self.life.running:
            self.metrics.beat()
            self.take_claimed()
            self.publish_due()
            self.send_dead()
            self.slot.producer.poll(self.wait_time())
            self.look_after_producer()
            self.hand_over()

    def take_claimed(self) -> None:
        while True:
            try:
                sent, rows = self.inbox.get_nowait()
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
        """Send the outcomes of publishes to the settler."""
        self.take_reports()
        if self.done:
            if self.done.acked:
                self.slot.outage.ok()
            self.outbox.put(self.done)
            self.done = Outcomes()

    def publish_due(self) -> None:
        if not self.held:
            return
        started = time.perf_counter()
        due, expired = self.held.take_due(time.time() + self.timing.advance, time.monotonic())
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
                    "handed back unpublished, since a peer may have taken them over", len(rows), self.held.hold_limit)

    def publish(self, rows: list[Claimed]) -> None:
        """Publish due rows, in order. Their delivery reports are queued as they come (`_reported`)
        and taken in that order by `take_reports`, after the poll that served them: per message, a
        partial and a list append instead of a closure and half a dozen calls."""
        output, allowed, send, shared = self.settings.output_topic, self.allowed, self.slot.producer.send, self.shared
        reported, decode = self.reported, codec.decode_headers
        sent, generation = time.monotonic(), self.slot.generation
        for row in rows:
            topic = row.topic
            # the allow-list in force now, not the one the message was accepted under
            if topic is not None and topic != output and not allowed.fullmatch(topic):
                self.to_dead.append((row, f"{reasons.TOPIC_NOT_ALLOWED}: {topic!r} does not match CHRONOS_ALLOWED_TOPICS"))
                continue
            shared.sending(sent)
            send(topic or output, row.value, row.key, decode(row.headers),
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
        self.slot.watch.acked(now)

    def failure_kind(self, err, topic: str, generation: int) -> str:
        """What a failed publish means (`ProducerWatch.failed`); a report of a producer replaced since
        says nothing more about the message (purged, or failed like the rest): hand it back."""
        if generation != self.slot.generation:
            return PRODUCER_FAILURE
        kind = self.slot.watch.failed(err, topic, time.monotonic())
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
            self.slot.producer.send(self.settings.dlq_topic, row.value, row.key, headers,
                                    functools.partial(self.reported, row, sent, self.slot.generation, reason))

    def dead_letter_reported(self, row: Claimed, reason: str, generation: int, err) -> None:
        """The delivery report of a dead letter: the row is deleted once dead-lettered, parked if the
        dead-letter topic refuses it for good, handed back or retried later otherwise."""
        if err is None:
            self.slot.watch.acked(time.monotonic())
            self.done.dead.append((row, reason))
            return
        action = after_failure(self.failure_kind(err, self.settings.dlq_topic, generation), dead_letter=True)
        if action is AfterFailure.PARK:
            self.done.park.append((row, f"{reason}; dead-letter topic: {err.name()}: {err.str()}"))
        elif action is AfterFailure.RELEASE:
            self.done.release.append(row)
        else:  # the dead-letter topic refuses for now: the whole row is tried again after a backoff
            self.throttle.warning("dead retry", "dead-lettering %s failed (%s); trying it again later",
                                  row.id, err.str())
            self.done.retry.append((row, f"dead-letter topic: {err.name()}: {err.str()}",
                                    retry_delay_ms(row.attempts)))

    # -- the producer ----------------------------------------------------------------------------

    def look_after_producer(self) -> None:
        """Replace the producer when its watch says it is at fault or has stalled, and serve what
        replaced producers still have to report (`ProducerSlot.look_after`)."""
        self.take_reports()  # what they say about the producer first
        now = time.monotonic()
        self.slot.watch.working(self.shared.in_flight > 0, now)
        self.slot.look_after(now)
        self.take_reports()  # the purged publishes of the producers replaced
        watch = self.slot.watch
        self.shared.kafka_stall_at = watch.last_replacement if watch.stall_logged else None

    # -- shutdown, in `FirerProcess.shutdown`'s order ---------------------------------------------

    def hand_back_unpublished(self) -> None:
        """Hand the settler every row held and not published, dead letters included."""
        self.take_claimed()
        self.done.release += self.held.take_all() + [row for row, _ in self.to_dead]
        self.to_dead = []
        self.hand_over()

    def finish_in_flight(self, timeout: float) -> None:
        """Wait up to `timeout` seconds (less on a hard stop) for the reports of the publishes in flight,
        and hand the settler what they say."""
        deadline = time.monotonic() + timeout
        while self.shared.in_flight > 0 and time.monotonic() < deadline and not self.life.hard_stop:
            self.slot.producer.poll(0.1)
            self.slot.serve_retired()
            self.take_reports()
        # failed for good while stopping: a peer dead-letters them
        self.done.release += [row for row, _ in self.to_dead]
        self.to_dead = []
        self.hand_over()

    def leftovers(self) -> list[Claimed]:
        """The rows claimed after the claimer was told to stop (a claim that would not end)."""
        self.take_claimed()
        return self.held.take_all()
