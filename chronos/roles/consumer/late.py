"""The late path: late messages published now, invalid ones and those their destination refuses
for good dead-lettered, dead letters the dead-letter topic refuses for good parked in PostgreSQL; what
becomes of a failed publish is the domain's one failure policy (`delivery.after_failure`)."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable

from chronos import codec
from chronos.config import Settings
from chronos.domain import cron
from chronos.domain.delivery import (PRODUCER_FAILURE, PURGED_IN_FLIGHT, AfterFailure, DeliveryError, Failure,
                                     after_failure, dead_letter_headers, failure_reason)
from chronos.domain.model import Parked
from chronos.errors import StoreUnavailable
from chronos.logs import Throttle
from chronos.ports import InputMessage as Message, IntakeStore
from chronos.roles.consumer.group import KAFKA, Group, OutOfReach
from chronos.runtime.backoff import Backoff, Outage
from chronos.runtime.process import Lifecycle
from chronos.runtime.producer import ProducerSlot

log = logging.getLogger("chronos.consumer")


@dataclass(slots=True)
class Outgoing:
    """One publish of a consumer batch: a late message to its destination (no `reason`), or a dead
    letter (`reason` set; `parsed` too when it is a late message its destination refused)."""

    topic: str
    msg: Message
    parsed: codec.Parsed | None = None
    reason: str | None = None
    carried: list | None = None  # a dead letter's headers as read (a name the client cannot produce escaped)

    def original_headers(self) -> list:
        """The message's headers as read, Chronos headers included."""
        if self.carried is None:
            self.carried = codec.read_headers(self.msg)[0] or []
        return self.carried

    def headers(self) -> list:
        if self.reason is None and self.parsed is not None:
            return self.parsed.headers
        return dead_letter_headers(list(self.original_headers()), self.reason or "",
                                   f"{self.msg.topic()}/{self.msg.partition()}/{self.msg.offset()}")


class LatePath:
    """Publishes a batch's late messages and dead letters and waits for every acknowledgement (on the
    writer's thread: the producer and the store are the writer's while a batch is pending)."""

    def __init__(self, settings: Settings, life: Lifecycle, *, slot: ProducerSlot, store: IntakeStore, group: Group,
                 db_outage: Outage, stats: dict[str, int], clock: Callable[[], float]):
        """`db_outage` is the writer's log of PostgreSQL's outages (parking waits them out too); `stats`
        the consumer's totals; `clock` measures how long Kafka has acknowledged nothing."""
        self.settings, self.life, self.slot, self.store, self.group = settings, life, slot, store, group
        self.db_outage, self.stats, self.clock = db_outage, stats, clock
        self.hold_s = settings.hold_time_ms / 1000.0
        self.throttle = Throttle(log)
        # where what no topic took is kept: the store; with cells, each in its partition's cell (`Cells.park`)
        self.keep_parked: Callable[[list[tuple[int | None, Parked]]], list[tuple[int | None, Parked]]] = \
            self.park_here

    def publish(self, late: list[tuple[Message, codec.Parsed]], dead: list[tuple[Message, str, list]]) -> list[str] | None:
        """Publish late and dead-lettered messages and wait for every acknowledgement, retrying failures
        that may pass with backoff. A late message refused for good is dead-lettered, a dead letter
        refused for good is parked. Returns the reasons of the late messages dead-lettered, or None
        when stopped first."""
        outbox = [Outgoing(parsed.topic or self.settings.output_topic, msg, parsed=parsed) for msg, parsed in late]
        outbox += [Outgoing(self.settings.dlq_topic, msg, reason=reason, carried=carried)
                   for msg, reason, carried in dead]
        refused: list[str] = []
        backoff = Backoff(first=0.5, cap=10.0)
        # the group's progress, read once the publishes have waited half the hold time (not per batch)
        started, acked = self.clock(), [0]
        others_before: list[dict[int, int] | None] = []
        while outbox:
            reports: dict[int, DeliveryError | None] = {}  # id(item) -> its delivery report's error

            def delivered(err, _msg, item: Outgoing) -> None:
                reports[id(item)] = err
                if err is None:
                    acked[0] += 1
                    self.slot.watch.acked(time.monotonic())
            send = self.slot.producer.send
            for item in outbox:
                send(item.topic, item.msg.value(), item.msg.key(), item.headers(), functools.partial(delivered, item=item))
            self.slot.watch.working(True, time.monotonic())
            while self.slot.producer.flush(min(1.0, self.hold_s)) > 0:
                if not self.life.running and self.life.hard_stop:
                    return None
                self.slot.look_after(time.monotonic())  # a producer that hangs: its publishes are purged, failed, retried
                self.give_up_unacknowledged(started, acked[0], others_before)
            # a replaced producer that never reported a publish: published again (at least once)
            unreported = Failure(PURGED_IN_FLIGHT, "no delivery report from a replaced producer")
            failed = [(item, err, self.slot.watch.failed(err, item.topic, time.monotonic()))
                      for item in outbox if (err := reports.get(id(item), unreported)) is not None]
            self.slot.look_after(time.monotonic())
            if not failed:
                self.slot.watch.working(False, time.monotonic())
                self.slot.outage.ok()
                return refused
            outbox, parked, transient = [], [], []
            for item, err, kind in failed:
                parsed = item.parsed if item.reason is None else None  # None: a dead letter
                # a late message is tried until it is published or refused for good: a batch waits for it
                action = after_failure(kind, dead_letter=parsed is None)
                if action in (AfterFailure.RELEASE, AfterFailure.RETRY):
                    transient.append((item, err))
                elif action is AfterFailure.DEAD and parsed is not None:  # a late message refused for good
                    reason = failure_reason(err)
                    refused.append(reason)
                    self.throttle.warning("refused", "publish of late message %s to %s failed for good (%s); "
                                          "to the dead-letter topic", parsed.message_id, item.topic, reason)
                    outbox.append(Outgoing(self.settings.dlq_topic, item.msg, parsed=item.parsed, reason=reason))
                else:
                    parked.append((item.msg.partition(), self.parked(item, err)))
            if parked and not self.park(parked):
                return None
            if transient:
                self.throttle.warning("publish", "%d publishes failed (%s); retrying", len(transient),
                                      transient[0][1].str())
                outbox += [item for item, _ in transient]
                if any(kind == PRODUCER_FAILURE for _, _, kind in failed):
                    self.slot.look_after(time.monotonic())
                self.give_up_unacknowledged(started, acked[0], others_before)
                if not self.life.sleep(backoff.failed()):
                    return None
        return refused

    def give_up_unacknowledged(self, started: float, acked: int, others_before: list[dict[int, int] | None]) -> None:
        """Raise `OutOfReach` when Kafka has acknowledged none of the batch's publishes since `started`
        (by `self.clock`) for longer than the hold time while another consumer of the group commits
        (`Group.others_serve`; `others_before` holds `Group.progress` as read half a hold time in), after
        purging what waits to be sent (a new producer takes the old one's place), so that nothing of the
        given-up batch is published later by this consumer: whoever takes its partitions publishes it.
        A request already on the wire cannot be recalled: it may still land, once more (at least once).
        While no other consumer commits, it goes on publishing, in the group."""
        down_for = self.clock() - started
        if acked or not self.life.running:
            return
        if down_for > self.hold_s / 2 and not others_before:
            others_before.append(self.group.progress())  # what the others had committed by then
        if down_for <= self.hold_s or not self.group.others_serve(others_before[0] if others_before else None):
            return
        self.slot.replace(f"nothing of a batch's late messages acknowledged for {down_for:.1f}s", time.monotonic())
        self.slot.serve_retired()
        raise OutOfReach(KAFKA, down_for, 1.0)

    def parked(self, item: Outgoing, err: DeliveryError) -> Parked:
        """What to keep of a dead letter the dead-letter topic refused for good: the message as it was
        read, where it was going, and both reasons."""
        msg, parsed = item.msg, item.parsed
        return Parked(message_id=parsed.message_id if parsed else None,
                      source=f"{msg.topic()}/{msg.partition()}/{msg.offset()}",
                      topic=(parsed.topic or self.settings.output_topic) if parsed else self.settings.dlq_topic,
                      deadline=cron.from_us(parsed.deadline_us) if parsed and parsed.deadline_us is not None else None,
                      key=msg.key(), value=msg.value(), headers=codec.encode_headers(item.original_headers()),
                      reason=f"{item.reason}; dead-letter topic: {err.name()}: {err.str()}")

    def park_here(self, parked: list[tuple[int | None, Parked]]) -> list[tuple[int | None, Parked]]:
        """Park these (each with the input partition it was read from) in the store; returns those not kept."""
        self.store.park([p for _, p in parked])
        return []

    def park(self, parked: list[tuple[int | None, Parked]]) -> bool:
        """Keep in PostgreSQL what no topic accepted (with the input partitions they were read from); False if
        stopped before it was kept."""
        left = parked
        while left:
            try:
                left = self.keep_parked(left)
            except StoreUnavailable as exc:
                if not self.life.sleep(self.db_outage.failed(exc)):
                    return False
        self.db_outage.ok()
        self.stats["parked"] += len(parked)
        for _, p in parked:
            log.warning("parked the message at %s in chronos_parked: the dead-letter topic %s refused it (%s)",
                        p.source, self.settings.dlq_topic, p.reason)
        return True
