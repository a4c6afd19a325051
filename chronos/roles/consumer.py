"""`chronos consumer`: input topic → store (or straight to the output when already late).

Per poll: parse every message's headers, dead-letter the invalid ones, publish the late ones,
write the rest in one COPY batch. A late message its destination refuses for good (too large,
say) is dead-lettered; a dead letter the dead-letter topic refuses for good is parked in
PostgreSQL (`chronos_parked`). Offsets are committed only after every message of the batch is
durable somewhere (the store, its destination, the dead-letter topic or parked), so a crash at
any point loses nothing.

PostgreSQL out of reach for longer than the hold time while a batch waits to be written (this host
cut off from it, Kafka still reachable), or Kafka acknowledging none of a batch's late messages for as
long: the consumer gives that batch up, uncommitted (its late publishes not yet sent are purged), and
leaves its consumer group, so that the other consumers take its partitions and read the batch again;
it rejoins once the service answers again.
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, cast

from chronos import codec

from chronos.domain import cron, reasons
from chronos.config import Settings
from chronos.errors import KafkaUnanswered, StoreRejected, StoreUnavailable
from chronos.domain.delivery import (PARTITION_EOF, PRODUCER_FAILURE, PURGED_IN_FLIGHT, AfterFailure, DeliveryError,
                                     Failure, after_failure, dead_letter_headers, failure_reason)
from chronos.domain.intake import Decision, Rules, Verdict, decide
from chronos.logs import Throttle
from chronos.ops.telemetry import ConsumerTelemetry, postgres_reached
from chronos.runtime.process import Lifecycle
from chronos.runtime.backoff import Backoff, POSTGRES_RETRY_CAP_S, Outage
from chronos.runtime.producer import ProducerSlot, ProducerWatch
from chronos.domain.model import Parked, Row
from chronos.ports import GroupWatcher, InputConsumer, InputMessage as Message, IntakeStore, KafkaOutage, Publisher

log = logging.getLogger("chronos.consumer")

INSERT, REPLACE, CANCEL = "insert", "replace", "cancel"

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


@dataclass
class Batch:
    """The outcome of sorting one poll's messages; built by `sort_batch`, a pure function.

    `ops` holds one final store operation per id, so that a batch that schedules, replaces
    and cancels the same id has the same effect as those messages applied one by one.
    """

    ops: dict[str, tuple[str, Row | None]] = field(default_factory=dict)
    sources: dict[str, Message] = field(default_factory=dict)  # each stored id's message (headers read again if needed)
    late: list[tuple[Message, codec.Parsed]] = field(default_factory=list)
    # (message, reason, the headers to carry: as read, a name the client cannot produce escaped)
    dead: list[tuple[Message, str, list]] = field(default_factory=list)
    duplicates: int = 0

    def of(self, op: str) -> list:
        return [row if op != CANCEL else mid for mid, (o, row) in self.ops.items() if o == op]

    @property
    def rows(self) -> dict[str, Row]:
        return {mid: row for mid, (op, row) in self.ops.items() if row is not None}


def _row(mid: str, parsed: codec.Parsed, decision: Decision, msg: Message, rules: Rules) -> Row:
    assert decision.deadline_us is not None  # every ENQUEUE and LATE decision has one
    topic = parsed.topic if parsed.topic != rules.output_topic else None
    return Row(mid, decision.deadline_us, topic, msg.key(), msg.value(),
               codec.encode_headers(parsed.headers), parsed.ordering_key, parsed.cron,
               parsed.timezone if parsed.cron is not None else None,
               parsed.dst_policy if parsed.cron is not None else None)


def sort_batch(messages: list[Message], now_us: int, rules: Rules) -> Batch:
    """Sort a poll's messages into a `Batch`. Runs of plain messages (valid, neither action nor
    recurrence, to the output topic: nearly all of them) are sorted by `codec.intake` in native
    code; each other message by `_sort_one`, with the same outcome."""
    batch = Batch()
    i, n = 0, len(messages)
    while i < n:
        i, read = codec.intake(messages, i, now_us, rules.timing_advance_us, rules.max_lateness_us,
                               rules.output_topic, batch, Row, INSERT)
        if i < n:
            _sort_one(batch, messages[i], now_us, rules, read)
            i += 1
    return batch


def _sort_one(batch: Batch, msg: Message, now_us: int, rules: Rules,
              read: tuple[list | None, str | None] | Exception | None = None) -> None:
    """Sort one message of a poll into `batch`. `read` is what `codec.read_headers` gave for it (or
    raised), when it was read already: confluent-kafka's conversion of a message's headers crashes
    the process if asked again after it failed."""
    ops = batch.ops
    try:
        if isinstance(read, Exception):
            raise read
        headers, bad_name = read if read is not None else codec.read_headers(msg)
    except Exception as exc:  # noqa: BLE001 - no header content may stop the consumer; this message only
        log.error("could not read the headers of %s/%s/%s (%s: %s); dead-lettering it without them",
                  msg.topic(), msg.partition(), msg.offset(), type(exc).__name__, exc)
        batch.dead.append((msg, f"{reasons.UNREADABLE_HEADERS}: {type(exc).__name__}: {exc}", []))
        return
    headers = headers or []
    if bad_name is not None:
        batch.dead.append((msg, bad_name, headers))
        return
    parsed = codec.parse_headers(headers)
    decision: Decision = decide(parsed, now_us, rules)
    verdict, mid = decision.verdict, parsed.message_id
    if verdict is Verdict.INVALID:
        batch.dead.append((msg, decision.reason or "invalid", headers))
        return
    assert mid is not None  # headers without a valid id are INVALID
    previous = ops.get(mid, (None, None))[0]
    if verdict is Verdict.CANCEL:
        ops[mid] = (CANCEL, None)
    elif verdict is Verdict.LATE:
        if decision.replace:
            ops[mid] = (CANCEL, None)  # the replacement fires now; the waiting version goes
            batch.late.append((msg, parsed))
        elif previous in (INSERT, REPLACE):
            batch.duplicates += 1      # its id is waiting (scheduled earlier in this batch)
        else:
            batch.late.append((msg, parsed))
    elif decision.replace or previous == CANCEL:
        ops[mid] = (REPLACE, _row(mid, parsed, decision, msg, rules))
        batch.sources[mid] = msg
    elif previous in (INSERT, REPLACE):
        batch.duplicates += 1
    else:
        ops[mid] = (INSERT, _row(mid, parsed, decision, msg, rules))
        batch.sources[mid] = msg


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


class ConsumerProcess:
    """The consumer's loop: read a batch, sort it, make it durable, commit its offsets."""

    def __init__(self, settings: Settings, life: Lifecycle, *, store: IntakeStore,
                 producers: Callable[[], tuple[Publisher, KafkaOutage]],
                 consumers: Callable[[Callable], tuple[InputConsumer, KafkaOutage]], telemetry: ConsumerTelemetry,
                 watchers: Callable[[], GroupWatcher], clock: Callable[[], float] = time.monotonic):
        """`producers` makes a Kafka producer and the log of its outages (again after a fatal error);
        `consumers(on_commit)` makes the input topic's consumer, reporting commits to `on_commit`;
        `watchers()` a client of the group that never joins it, to read what the group has committed
        (made at the first outage; the input consumer serves one caller at a time, and the loop calls it
        every 50 ms, so another thread's call waits on it for good); `clock` measures PostgreSQL's
        outages against the hold time."""
        self.settings, self.life = settings, life
        self.rules = Rules.from_settings(settings)
        self.store = store
        self.clock = clock
        self.hold_s = settings.hold_time_ms / 1000.0
        self.db_outage = Outage(log, cap=POSTGRES_RETRY_CAP_S, clock=clock)
        self.left_group_at: float | None = None  # `clock()` when it left the group for an outage; None while in it
        self.left_for = POSTGRES                  # the service whose outage it left for
        self.watchers, self.watcher = watchers, cast(GroupWatcher | None, None)
        self.committed_here: dict[int, int] = {}  # input partition -> the offset this consumer committed last
        self.throttle = Throttle(log)
        self.slot = ProducerSlot(producers, ProducerWatch("the consumer", settings.publish_stall_ms / 1000.0,
                                                          time.monotonic()))
        self.consumer, self.consumer_outage = consumers(self.on_committed)
        self.uncommitted: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset, not committed yet
        self.last_batch: list[Message] | None = None
        self.losses = 0  # the group's sessions lost so far (`on_lost`): a batch read before one is not written
        self.stats = {"consumed": 0, "enqueued": 0, "late": 0, "dead": 0, "duplicates": 0, "replaced": 0,
                      "cancelled": 0, "cancelled_in_flight": 0, "cancel_unknown": 0, "parked": 0}
        self.metrics = telemetry
        self.metrics.follow(lambda: self.stats)
        self.metrics.follow_producer(self.slot.watch)
        self.metrics.follow_postgres(lambda: [self.store.link])
        self.next_ping = 0.0
        self.next_lag = 0.0  # monotonic: when `sample_lag` reads the positions next

    def run(self) -> None:
        """Read batch N+1 (and sort it) while batch N is written on the writer thread; commit N's
        offsets once N is durable, and never before, so offsets are committed in order."""
        self.subscribe()
        log.info("consuming %s (group %s), batch %d", self.settings.input_topic, self.settings.consumer_group,
                 self.settings.batch_size)
        # the producer answers metadata requests at once; the group consumer may take seconds
        self.metrics.serve(postgres=lambda: postgres_reached(self.store), postgres_detail=self.out_of_group,
                           kafka=lambda: self.slot.producer, kafka_topic=self.settings.input_topic)
        # the store, the producer and the stats are the writer's while a batch is pending
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="consumer-writer")
        pending: tuple[Future, list[Message], int] | None = None
        try:
            while self.life.running:
                messages = self.consumer.consume(num_messages=self.settings.batch_size, timeout=0.05)
                self.metrics.beat()
                self.sample_lag(time.monotonic())
                real = self.readable(messages)
                epoch = self.losses  # after the poll: a loss it reported came before these messages
                batch = sort_batch(real, time.time_ns() // 1000, self.rules) if real else None
                if pending is not None and (real or pending[0].done()):
                    done, pending = pending, None
                    try:
                        durable = self.finish(*done)
                    except OutOfReach as exc:
                        # the batch read meanwhile (`real`) follows the given-up one: committing it would
                        # skip that one, so it is given up too, and read again with it
                        if not self.sit_out(exc, len(done[1]) + len(real)):
                            break
                        continue
                    except PartitionsLost:
                        log.warning("gave up a batch of %d messages read before the group's session was lost: "
                                    "not written, not committed; whoever holds its partitions reads it again",
                                    len(done[1]))
                        durable = True  # nothing of it to wait for
                    if not durable:
                        break  # stopped before that batch was durable: it is read again
                if batch is not None:
                    self.consumer_outage.ok()
                    pending = (writer.submit(self.write, real, batch, epoch), real, epoch)
                elif pending is None and not messages:
                    self.keep_alive()
            if pending is not None:
                try:
                    self.finish(*pending)
                except (OutOfReach, PartitionsLost) as exc:
                    log.warning("stopping: gave up the last batch (%s); it was not committed, so it is read again",
                                exc)
        finally:
            writer.shutdown(wait=True)
            self.close()

    def sample_lag(self, now: float) -> None:
        """Every LAG_EVERY_S, the input messages on the assigned partitions past this consumer's position,
        for `chronos_consumer_lag_messages`, per partition: the high watermark its last fetch reported
        (the client's cached one, which a fetch keeps right; asking the broker would cost a request and, on
        the embedded broker, be wrong) less the position. A partition not fetched yet counts 0."""
        if now < self.next_lag:
            return
        self.next_lag = now + LAG_EVERY_S
        try:
            lag = self.consumer.lag()
        except KafkaUnanswered as exc:  # no gauge this time; the loop goes on
            self.throttle.warning("lag", "could not read the consumer's positions for its lag gauge: %s", exc)
            return
        self.metrics.consumer_lag(lag)

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

    def finish(self, written: Future, messages: list[Message], epoch: int) -> bool:
        """Wait for a batch's write; commit its offsets if it is durable and the group's session it was read
        in still holds (after a loss its partitions may be another consumer's, whose offsets a commit
        would move back). False if it is not durable (stopped first); raises `OutOfReach` or
        `PartitionsLost` if the write gave it up."""
        if not written.result():
            return False
        if self.losses != epoch:
            return True
        self.commit(messages)
        self.last_batch = messages
        return True

    def write(self, messages: list[Message], batch: Batch, epoch: int | None = None) -> bool:
        """Make one sorted batch durable and acknowledged; False if stopped before it was. Raises
        `OutOfReach`, the batch not written, once PostgreSQL has not answered for the hold time (or its late
        messages not published, once Kafka has acknowledged none of them for as long), and `PartitionsLost`
        before a try when the group's session was lost since the batch was read (`epoch`)."""
        unreached_since: float | None = None
        others_before: dict[int, int] | None = None
        while True:
            if epoch is not None and self.losses != epoch:
                raise PartitionsLost("the group's session was lost since it was read")
            tried = self.clock()
            try:
                started = time.perf_counter()
                try:
                    inserted, replaced, cancelled, in_flight = self.store.apply(
                        batch.of(INSERT), batch.of(REPLACE), batch.of(CANCEL))
                except StoreRejected as exc:
                    inserted, replaced, cancelled, in_flight = self.apply_one_by_one(batch, exc)
                # late messages passed `decide`, so their headers are valid and carry an id
                waiting = self.store.waiting_ids(cast(str, p.message_id) for _, p in batch.late)
                break
            except StoreUnavailable as exc:
                if unreached_since is None:
                    # out of reach since this first failed try at the latest (a statement PostgreSQL does not
                    # answer fails only CHRONOS_DATABASE_TIMEOUT_MS later), or since the idle probes failed
                    unreached_since = min(tried, self.clock() - self.db_outage.down_for())
                    others_before = self.group_progress()
                delay = self.db_outage.failed(exc)
                if not self.wait_to_retry(unreached_since, self.clock(), delay, others_before):
                    return False
        self.db_outage.ok()
        if batch.ops:
            self.metrics.batch("insert", len(batch.ops), time.perf_counter() - started)
        late = [(m, p) for m, p in batch.late if p.message_id not in waiting]
        started = time.perf_counter()
        refused = self.publish(late, batch.dead)
        if refused is None:
            return False
        if late or batch.dead:
            self.metrics.batch("publish", len(late) + len(batch.dead), time.perf_counter() - started)
        if refused:
            self.metrics.dead_lettered(refused)
        s = self.stats
        s["consumed"] += len(messages)
        s["enqueued"] += inserted
        s["late"] += len(late) - len(refused)
        s["dead"] += len(batch.dead) + len(refused)
        s["duplicates"] += batch.duplicates + (len(batch.of(INSERT)) - inserted) + (len(batch.late) - len(late))
        s["replaced"] += replaced
        s["cancelled"] += cancelled
        s["cancelled_in_flight"] += in_flight
        s["cancel_unknown"] += len(batch.of(CANCEL)) - cancelled - in_flight
        if batch.dead:
            self.metrics.dead_lettered(r for _, r, _ in batch.dead)
            reasons = sorted({r.split(":", 1)[0] for _, r, _ in batch.dead})
            self.throttle.warning("dead", "%d invalid messages sent to %s (%s)", len(batch.dead),
                                  self.settings.dlq_topic, ", ".join(reasons))
        return True

    def apply_one_by_one(self, batch: Batch, exc: StoreRejected) -> tuple[int, int, int, int]:
        """PostgreSQL refused the batch: find the rows it refuses and dead-letter only those."""
        log.warning("postgres refused a batch of %d operations (%s); applying them one by one", len(batch.ops), exc)
        totals = [0, 0, 0, 0]
        for message_id, (op, row) in list(batch.ops.items()):
            try:
                rows = [row] if row is not None else []  # only a cancel has no row
                done = self.store.apply(rows if op == INSERT else [], rows if op == REPLACE else [],
                                        [message_id] if op == CANCEL else [])
            except StoreRejected as row_exc:
                del batch.ops[message_id]
                msg = batch.sources[message_id]
                # its headers were read once without fault (else it would not have a row): read again
                batch.dead.append((msg, f"{reasons.STORE_REJECTED}: {row_exc}", codec.read_headers(msg)[0] or []))
                continue
            totals = [a + b for a, b in zip(totals, done)]
        return totals[0], totals[1], totals[2], totals[3]

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
                    parked.append(self.parked(item, err))
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
        (`others_serve`; `others_before` holds `group_progress` as read half a hold time in), after
        purging what waits to be sent (a new producer takes the old one's place), so that nothing of the
        given-up batch is published later by this consumer: whoever takes its partitions publishes it.
        A request already on the wire cannot be recalled: it may still land, once more (at least once).
        While no other consumer commits, it goes on publishing, in the group."""
        down_for = self.clock() - started
        if acked or not self.life.running:
            return
        if down_for > self.hold_s / 2 and not others_before:
            others_before.append(self.group_progress())  # what the others had committed by then
        if down_for <= self.hold_s or not self.others_serve(others_before[0] if others_before else None):
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

    def park(self, parked: list[Parked]) -> bool:
        """Keep in PostgreSQL what no topic accepted; False if stopped before it was kept."""
        while True:
            try:
                self.store.park(parked)
                break
            except StoreUnavailable as exc:
                if not self.wait_for_store(exc):
                    return False
        self.db_outage.ok()
        self.stats["parked"] += len(parked)
        for p in parked:
            log.warning("parked the message at %s in chronos_parked: the dead-letter topic %s refused it (%s)",
                        p.source, self.settings.dlq_topic, p.reason)
        return True

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

    def keep_alive(self) -> None:
        """While idle, ask PostgreSQL the time now and then, so /healthz knows it is reachable."""
        now = time.monotonic()
        if not self.metrics.serving or now < self.next_ping or now - self.store.last_ok < 1.0:
            return
        try:
            self.store.db_clock_us()
        except StoreUnavailable as exc:
            self.next_ping = now + self.db_outage.failed(exc)
            return
        self.db_outage.ok()
        self.next_ping = now + 1.0

    def wait_for_store(self, exc: StoreUnavailable) -> bool:
        """Wait out a PostgreSQL outage's backoff; False if stopped meanwhile."""
        return self.life.sleep(self.db_outage.failed(exc))

    def wait_to_retry(self, unreached_since: float, now: float, delay: float,
                      others_before: dict[int, int] | None) -> bool:
        """Wait `delay` (the outage's backoff) before writing a batch again, but not past the hold time
        since PostgreSQL was last reached (`unreached_since`, by `self.clock`); False if stopped meanwhile.
        Raises `OutOfReach` once the hold time is over and another consumer of the group has committed
        since the outage began (`others_before`: `group_progress` then): the partitions go to a consumer
        that can serve them rather than wait here for as long as the outage lasts. While no other
        consumer commits (PostgreSQL is down for all of them, or this one is the only one), leaving would
        hand the partitions to nobody who can serve them: it goes on waiting, in the group."""
        down_for = now - unreached_since
        if down_for >= self.hold_s and self.life.running:
            if self.others_serve(others_before):
                raise OutOfReach(POSTGRES, down_for, delay)
            self.throttle.warning("alone", "cannot reach PostgreSQL for %.1fs, and no other consumer of group %s "
                                  "has committed since: staying in the group (no one else could serve its "
                                  "partitions)", down_for, self.settings.consumer_group)
            return self.life.sleep(delay)
        return self.life.sleep(max(0.0, min(delay, self.hold_s - down_for)))

    def group_progress(self) -> dict[int, int] | None:
        """The group's committed offset of every input partition (partition -> offset), read by the
        watcher on the writer thread, or None when Kafka does not say in time (its coordinator out of
        reach too)."""
        if self.watcher is None:
            self.watcher = self.watchers()
        return self.watcher.group_progress(self.settings.input_topic, KAFKA_PROBE_S)

    def others_serve(self, before: dict[int, int] | None) -> bool:
        """Whether another consumer of the group committed since `before` (`group_progress` then): it
        reaches what this one cannot, so the partitions are better in its hands. An offset this consumer
        committed itself (an asynchronous commit landing after `before`) is not the others' progress."""
        now = self.group_progress()
        if before is None or now is None:
            return False
        return any(offset > before.get(partition, -1001) and offset != self.committed_here.get(partition)
                   for partition, offset in now.items())

    def sit_out(self, exc: OutOfReach, given_up: int) -> bool:
        """Leave the consumer group for an outage of PostgreSQL or Kafka, probe the service until it
        answers, rejoin.

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
        self.metrics.consumer_lag({})  # its partitions are the other consumers' now
        self.left_group_at, self.left_for = self.clock(), exc.service
        log.warning("cannot reach %s for %.1fs, longer than the hold time (%d ms): gave up %d messages "
                    "(not committed: they are read again) and left consumer group %s so that other consumers take "
                    "its partitions; rejoining once %s answers", exc.service, exc.down_for,
                    self.settings.hold_time_ms, given_up, self.settings.consumer_group, exc.service)
        if not self.wait_for(exc.service, exc.retry_in):
            return False
        out_for = self.clock() - self.left_group_at
        self.subscribe()
        self.left_group_at = None
        log.warning("%s answers again: rejoining consumer group %s (out of it for %.1fs)",
                    exc.service, self.settings.consumer_group, out_for)
        return True

    def wait_for(self, service: str, delay: float) -> bool:
        """Out of the group: ask `service` with the outage's backoff until it answers (PostgreSQL the time,
        the cheapest statement; Kafka the cluster's metadata), serving the Kafka consumer in between; False
        if stopped first."""
        backoff = Backoff(first=max(delay, 0.1), cap=KAFKA_PROBE_S)
        while self.serve_kafka(delay):
            if service == KAFKA:
                if self.slot.producer.answers(KAFKA_PROBE_S):
                    return True
                delay = backoff.failed()
                continue
            try:
                self.store.db_clock_us()
            except StoreUnavailable as exc:
                delay = self.db_outage.failed(exc)
                continue
            self.db_outage.ok()
            return True
        return False

    def serve_kafka(self, seconds: float) -> bool:
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

    def close(self) -> None:
        log.info("stopping: consumed %(consumed)d, enqueued %(enqueued)d, late %(late)d, dead-lettered %(dead)d, "
                 "duplicates %(duplicates)d, replaced %(replaced)d, cancelled %(cancelled)d, cancelled in flight "
                 "(may still be delivered) %(cancelled_in_flight)d, cancels of ids not waiting %(cancel_unknown)d",
                 self.stats)
        self.metrics.close()  # first: its probe thread uses a Kafka client
        if self.last_batch:
            self.commit(self.last_batch, wait=True)
        for client in (self.consumer, self.watcher):
            try:
                if client is not None:
                    client.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort; offsets are already committed
                log.warning("closing the Kafka consumer: %s", exc)
        self.slot.producer.flush(5.0)
        self.store.close()

