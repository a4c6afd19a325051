"""The consumer's place in its group: reading and committing, the group's session lost, its progress
(what the other consumers commit), leaving it for an outage and joining it again."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, cast

from chronos.config import Settings
from chronos.errors import KafkaUnanswered
from chronos.domain.delivery import PARTITION_EOF
from chronos.logs import Throttle
from chronos.telemetry.metrics import ConsumerTelemetry
from chronos.ports import GroupWatcher, InputConsumer, InputMessage as Message, KafkaOutage
from chronos.runtime.process import Lifecycle

log = logging.getLogger("chronos.consumer")

# Out of the group, the consumer is called with this timeout at most: how soon it sees a stop.
SERVE_SLICE_S = 0.05
LAG_EVERY_S = 5.0    # how often the consumer reads its positions for the lag gauge
KAFKA_PROBE_S = 2.0  # out of the group for Kafka: how long a metadata request may take, and the longest wait between two


POSTGRES, KAFKA = "PostgreSQL", "Kafka"


class PartitionsLost(Exception):
    """The group's session was lost (this consumer was out of touch with the coordinator past the session
    timeout) after the batch was read: other consumers may have read and served its partitions, so the
    batch is given up unwritten and uncommitted; whoever holds its partitions now reads it again."""


class OutOfReach(Exception):
    """PostgreSQL did not answer for longer than the hold time while a batch waited to be written, or
    Kafka acknowledged none of its late messages for as long: the batch is given up (never committed,
    it is read again by whoever consumes its partitions)."""

    def __init__(self, service: str, down_for: float, retry_in: float):
        super().__init__(f"{service} out of reach for {down_for:.1f}s")
        self.service, self.down_for, self.retry_in = service, down_for, retry_in


def commit_offsets(messages: list[Message]) -> dict[tuple[str, int], int]:
    """The next offset to read for every (topic, partition) in the batch."""
    top: dict[tuple[str, int], int] = {}
    for msg in messages:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None  # consumed, not an event
        tp = (topic, partition)
        if offset + 1 > top.get(tp, -1):
            top[tp] = offset + 1
    return top


class Group:
    """The input topic's consumer in its group, for the loop's thread (`progress` and `others_serve` for
    the writer's, on a client of their own)."""

    def __init__(self, settings: Settings, life: Lifecycle, telemetry: ConsumerTelemetry, *,
                 consumers: Callable[[Callable], tuple[InputConsumer, KafkaOutage]],
                 watchers: Callable[[], GroupWatcher], clock: Callable[[], float]):
        """`consumers(on_commit)` makes the input topic's consumer, reporting commits to `on_commit`;
        `watchers()` a client of the group that never joins it, to read what the group has committed
        (made at the first outage; the input consumer serves one caller at a time, and the loop calls it
        every 50 ms, so another thread's call waits on it for good); `clock` times the stays out of it."""
        self.settings, self.life, self.metrics, self.clock = settings, life, telemetry, clock
        self.throttle = Throttle(log)
        self.consumer, self.outage = consumers(self.on_committed)
        self.watchers, self.watcher = watchers, cast(GroupWatcher | None, None)
        self.watching = threading.Lock()
        self.uncommitted: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset, not committed yet
        self.committed_here: dict[int, int] = {}  # input partition -> the offset this consumer committed last
        self.last_batch: list[Message] | None = None
        self.losses = 0  # the group's sessions lost so far (`on_lost`): a batch read before one is not written
        self.left_group_at: float | None = None  # `clock()` when it left the group for an outage; None while in it
        self.left_for = POSTGRES                  # the service whose outage it left for
        self.next_lag = 0.0  # monotonic: when `sample_lag` reads the positions next

    def commit(self, messages: list[Message], *, wait: bool = False) -> None:
        """Commit the batch's offsets. Asynchronous while running (the batch is already durable, so a
        lost commit only means a re-read, which the store ignores); the last one is waited for."""
        offsets = commit_offsets(messages)
        self.uncommitted.update(offsets)
        self.committed_here.update({partition: offset for (_, partition), offset in offsets.items()})
        try:
            self.consumer.commit_offsets(self.uncommitted, wait=wait)
            self.uncommitted.clear()
        except Exception as exc:  # noqa: BLE001 - a failed commit only means a re-read; the store is idempotent
            self.throttle.warning("commit", "offset commit failed (%s); the batch may be read again", exc)

    def subscribe(self) -> None:
        """Join the group on the input topic, told when the group's session is lost (`on_lost`)."""
        self.consumer.subscribe([self.settings.input_topic], on_lost=self.on_lost)

    def on_lost(self, _consumer, partitions: list[Any]) -> None:
        """The client's word that the group's session was lost (no answer from the coordinator past the
        session timeout): the partitions may be another consumer's already. What was read before is neither
        written (`write` checks before each try) nor committed."""
        self.losses += 1
        self.uncommitted.clear()
        self.last_batch = None
        log.warning("lost partitions %s of %s: the group's session timed out; what was read before is given up, "
                    "and the client joins again", sorted(tp.partition for tp in partitions), self.settings.input_topic)

    def on_committed(self, err, partitions) -> None:
        if err is not None:
            self.throttle.warning("commit", "offset commit failed (%s); the batch may be read again", err)

    def sample_lag(self, now: float) -> None:
        """Every LAG_EVERY_S, the position and end of each assigned partition, for its lag in messages
        (`chronos_consumer_lag_messages`: the high watermark its last fetch reported, the client's cached
        one, less the position; a partition not fetched yet counts 0) and in time
        (`chronos_consumer_lag_seconds`, chronos.telemetry.lag)."""
        if now < self.next_lag:
            return
        self.next_lag = now + LAG_EVERY_S
        try:
            ends = self.consumer.ends()
        except KafkaUnanswered as exc:  # no gauge this time; the loop goes on
            self.throttle.warning("lag", "could not read the consumer's positions for its lag gauge: %s", exc)
            return
        self.metrics.consumer_lag(ends, now)

    def readable(self, messages: list[Any]) -> list[Message]:
        """The messages of a poll without its errors (a partition's end is not one)."""
        real = []
        for msg in messages:
            err = msg.error()
            if err is None:
                real.append(msg)
            elif err.name() != PARTITION_EOF:
                self.throttle.warning("consume", "consume error: %s", err.str())
        return real

    def progress(self) -> dict[int, int] | None:
        """The group's committed offset of every input partition (partition -> offset), read by the
        watcher on the writer thread, or None when Kafka does not say in time (its coordinator out of
        reach too)."""
        with self.watching:  # with cells, each cell's writer thread may ask
            if self.watcher is None:
                self.watcher = self.watchers()
            return self.watcher.group_progress(self.settings.input_topic, KAFKA_PROBE_S)

    def others_serve(self, before: dict[int, int] | None, partitions: list[int] | None = None) -> bool:
        """Whether another consumer of the group committed since `before` (`progress` then), on one of
        `partitions` when given (a cell's): it reaches what this one cannot, so the partitions are better in
        its hands. An offset this consumer committed itself (an asynchronous commit landing after `before`)
        is not the others' progress."""
        now = self.progress()
        if before is None or now is None:
            return False
        return any(offset > before.get(partition, -1001) and offset != self.committed_here.get(partition)
                   for partition, offset in now.items() if partitions is None or partition in partitions)

    def serve(self, seconds: float) -> bool:
        """Call the Kafka consumer for `seconds`, the loop's health beating meanwhile; False if stopped
        first. The client completes leaving the group, and serves its callbacks, only inside these calls."""
        until = time.monotonic() + seconds
        while self.life.running:
            # nothing is assigned out of the group; a message still handed out is not committed, so the
            # partition's owner reads it
            self.readable(self.consumer.consume(num_messages=1,
                                                timeout=max(0.0, min(SERVE_SLICE_S, until - time.monotonic()))))
            self.metrics.beat()
            if time.monotonic() >= until:
                return True
        return False

    def out_of_group(self) -> str | None:
        """What /healthz adds to its PostgreSQL check while the consumer is out of its group for it."""
        left = self.left_group_at
        if left is None:
            return None
        return (f"out of consumer group {self.settings.consumer_group} for {self.clock() - left:.1f}s, "
                f"its partitions left to the other consumers until {self.left_for} answers")

    def sit_out(self, exc: OutOfReach, given_up: int, wait_for: Callable[[str, float], bool]) -> bool:
        """Leave the consumer group for an outage of PostgreSQL or Kafka, probe the service until it
        answers (`wait_for(service, delay)`, False if stopped first), rejoin.

        Leaving (`unsubscribe`, which sends LeaveGroup) rebalances the group at once, so its other
        consumers take these partitions and read the `given_up` messages again from the last commit;
        staying in it, the client's background thread would go on heartbeating and hold them for as long
        as the outage lasts. False if stopped before the service answered."""
        # nothing read before leaving may be committed later: once back in the group, a commit of a partition
        # another consumer has moved past meanwhile would move its offset back (the broker does not check
        # which partitions a member commits), and its messages would be read and delivered again
        self.uncommitted.clear()
        self.last_batch = None
        self.consumer.unsubscribe()
        self.metrics.consumer_lag({}, self.clock())  # its partitions are the other consumers' now
        self.left_group_at, self.left_for = self.clock(), exc.service
        log.warning("cannot reach %s for %.1fs, longer than the hold time (%d ms): gave up %d messages "
                    "(not committed: they are read again) and left consumer group %s so that other consumers take "
                    "its partitions; rejoining once %s answers", exc.service, exc.down_for,
                    self.settings.hold_time_ms, given_up, self.settings.consumer_group, exc.service)
        if not wait_for(exc.service, exc.retry_in):
            return False
        out_for = self.clock() - self.left_group_at
        self.subscribe()
        self.left_group_at = None
        log.warning("%s answers again: rejoining consumer group %s (out of it for %.1fs)",
                    exc.service, self.settings.consumer_group, out_for)
        return True

    def close(self) -> None:
        """Commit the last batch (waiting for it) and close the clients."""
        if self.last_batch:
            self.commit(self.last_batch, wait=True)
        for client in (self.consumer, self.watcher):
            try:
                if client is not None:
                    client.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort; offsets are already committed
                log.warning("closing the Kafka consumer: %s", exc)
