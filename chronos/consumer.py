"""`chronos consumer`: input topic → store (or straight to the output when already late).

Per poll: parse every message's headers, dead-letter the invalid ones, publish the late ones,
write the rest in one COPY batch. Offsets are committed only after the batch is durable in
PostgreSQL and every publish is acknowledged, so a crash at any point loses nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, TopicPartition

from chronos import codec
from chronos.config import Settings
from chronos.errors import StoreRejected, StoreUnavailable
from chronos.intake import Decision, Rules, Verdict, decide
from chronos.kafka import OutageLog, make_consumer, make_producer, produce
from chronos.logs import Throttle
from chronos.metrics import ConsumerTelemetry
from chronos.runtime import Lifecycle
from chronos.store import Backoff, Row, Store

log = logging.getLogger("chronos.consumer")

ERROR_HEADER = "chronosError"
SOURCE_HEADER = "chronosSource"


INSERT, REPLACE, CANCEL = "insert", "replace", "cancel"


@dataclass
class Batch:
    """The outcome of sorting one poll's messages; built by `sort_batch`, a pure function.

    `ops` holds one final store operation per id, so that a batch that schedules, replaces
    and cancels the same id has the same effect as those messages applied one by one.
    """

    ops: dict[str, tuple[str, Row | None]] = field(default_factory=dict)
    sources: dict[str, Message] = field(default_factory=dict)
    late: list[tuple[Message, codec.Parsed]] = field(default_factory=list)
    dead: list[tuple[Message, str]] = field(default_factory=list)
    duplicates: int = 0

    def of(self, op: str) -> list:
        return [row if op != CANCEL else mid for mid, (o, row) in self.ops.items() if o == op]

    @property
    def rows(self) -> dict[str, Row]:
        return {mid: row for mid, (op, row) in self.ops.items() if row is not None}


def _row(parsed: codec.Parsed, decision: Decision, msg: Message, rules: Rules) -> Row:
    topic = parsed.topic if parsed.topic != rules.output_topic else None
    return Row(parsed.message_id, decision.deadline_us, topic, msg.key(), msg.value(),
               codec.encode_headers(parsed.headers), parsed.ordering_key, parsed.cron,
               parsed.timezone if parsed.cron is not None else None)


def sort_batch(messages: list[Message], now_us: int, rules: Rules) -> Batch:
    batch = Batch()
    ops = batch.ops
    for msg in messages:
        parsed = codec.parse_headers(msg.headers())
        decision: Decision = decide(parsed, now_us, rules)
        verdict, mid = decision.verdict, parsed.message_id
        if verdict is Verdict.INVALID:
            batch.dead.append((msg, decision.reason or "invalid"))
            continue
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
            ops[mid] = (REPLACE, _row(parsed, decision, msg, rules))
            batch.sources[mid] = msg
        elif previous in (INSERT, REPLACE):
            batch.duplicates += 1
        else:
            ops[mid] = (INSERT, _row(parsed, decision, msg, rules))
            batch.sources[mid] = msg
    return batch


def commit_offsets(messages: list[Message]) -> list[TopicPartition]:
    """The next offset to read for every partition in the batch."""
    top: dict[tuple[str, int], int] = {}
    for msg in messages:
        tp = (msg.topic(), msg.partition())
        if msg.offset() + 1 > top.get(tp, -1):
            top[tp] = msg.offset() + 1
    return [TopicPartition(t, p, o) for (t, p), o in top.items()]


class ConsumerProcess:
    def __init__(self, settings: Settings, node_id: uuid.UUID, life: Lifecycle):
        self.settings, self.node_id, self.life = settings, node_id, life
        self.rules = Rules(timing_advance_us=settings.timing_advance_ms * 1000,
                           output_topic=settings.output_topic,
                           allowed_topics=settings.allowed_topics_re,
                           max_lateness_us=None if settings.max_lateness_ms is None
                           else settings.max_lateness_ms * 1000)
        self.store = Store(settings.database_url, node_id=node_id, hot_path=True)
        self.db_backoff = Backoff()
        self.throttle = Throttle(log)
        self.producer, self.producer_outage = make_producer(settings, "consumer producer")
        self.consumer, self.consumer_outage = make_consumer(settings, "consumer", on_commit=self.on_committed)
        self.uncommitted: dict[tuple[str, int], TopicPartition] = {}
        self.last_batch: list[Message] | None = None
        self.stats = {"consumed": 0, "enqueued": 0, "late": 0, "dead": 0, "duplicates": 0, "replaced": 0,
                      "cancelled": 0, "cancel_unknown": 0}
        self.metrics = ConsumerTelemetry(node_id, settings)
        self.metrics.follow(lambda: self.stats)
        self.next_ping = 0.0

    def run(self) -> None:
        self.consumer.subscribe([self.settings.input_topic])
        log.info("consuming %s (group %s), batch %d", self.settings.input_topic, self.settings.consumer_group,
                 self.settings.batch_size)
        # the producer answers metadata requests at once; the group consumer may take seconds
        self.metrics.serve(postgres=lambda: self.store.last_ok, kafka=lambda: self.producer,
                           kafka_topic=self.settings.input_topic)
        try:
            while self.life.running:
                messages = self.consumer.consume(num_messages=self.settings.batch_size, timeout=0.05)
                self.metrics.beat()
                if not messages:
                    self.keep_alive()
                    continue
                real = []
                for msg in messages:
                    err = msg.error()
                    if err is None:
                        real.append(msg)
                    elif err.code() != KafkaError._PARTITION_EOF:
                        self.throttle.warning("consume", "consume error: %s", err.str())
                if not real:
                    continue
                self.consumer_outage.ok()
                if not self.handle(real):
                    break  # stopping before the batch was durable: do not commit; it is read again
                self.commit(real)
                self.last_batch = real
        finally:
            self.close()

    def handle(self, messages: list[Message]) -> bool:
        """Make one batch durable and acknowledged; False if stopped before it was."""
        batch = sort_batch(messages, time.time_ns() // 1000, self.rules)
        while True:
            try:
                started = time.perf_counter()
                try:
                    inserted, replaced, cancelled = self.store.apply(batch.of(INSERT), batch.of(REPLACE),
                                                                     batch.of(CANCEL))
                except StoreRejected as exc:
                    inserted, replaced, cancelled = self.apply_one_by_one(batch, exc)
                waiting = self.store.waiting_ids(p.message_id for _, p in batch.late)
                break
            except StoreUnavailable as exc:
                if not self.wait_for_store(exc):
                    return False
        self.db_recovered()
        if batch.ops:
            self.metrics.batch("insert", len(batch.ops), time.perf_counter() - started)
        late = [(m, p) for m, p in batch.late if p.message_id not in waiting]
        started = time.perf_counter()
        if not self.publish(late, batch.dead):
            return False
        if late or batch.dead:
            self.metrics.batch("publish", len(late) + len(batch.dead), time.perf_counter() - started)
        s = self.stats
        s["consumed"] += len(messages)
        s["enqueued"] += inserted
        s["late"] += len(late)
        s["dead"] += len(batch.dead)
        s["duplicates"] += batch.duplicates + (len(batch.of(INSERT)) - inserted) + (len(batch.late) - len(late))
        s["replaced"] += replaced
        s["cancelled"] += cancelled
        s["cancel_unknown"] += len(batch.of(CANCEL)) - cancelled
        if batch.dead:
            self.metrics.dead_lettered(r for _, r in batch.dead)
            reasons = sorted({r.split(":", 1)[0] for _, r in batch.dead})
            self.throttle.warning("dead", "%d invalid messages sent to %s (%s)", len(batch.dead),
                                  self.settings.dlq_topic, ", ".join(reasons))
        return True

    def apply_one_by_one(self, batch: Batch, exc: StoreRejected) -> tuple[int, int, int]:
        """PostgreSQL refused the batch: find the rows it refuses and dead-letter only those."""
        log.warning("postgres refused a batch of %d operations (%s); applying them one by one", len(batch.ops), exc)
        totals = [0, 0, 0]
        for message_id, (op, row) in list(batch.ops.items()):
            try:
                done = self.store.apply([row] if op == INSERT else [], [row] if op == REPLACE else [],
                                        [message_id] if op == CANCEL else [])
            except StoreRejected as row_exc:
                del batch.ops[message_id]
                batch.dead.append((batch.sources[message_id], f"store_rejected: {row_exc}"))
                continue
            totals = [a + b for a, b in zip(totals, done)]
        return totals[0], totals[1], totals[2]

    def publish(self, late: list[tuple[Message, codec.Parsed]], dead: list[tuple[Message, str]]) -> bool:
        """Publish late and dead-lettered messages and wait for every acknowledgement, retrying failures."""
        outbox = []
        for msg, parsed in late:
            outbox.append((parsed.topic or self.settings.output_topic, msg.key(), msg.value(), parsed.headers))
        for msg, reason in dead:
            headers = list(msg.headers() or [])
            headers.append((ERROR_HEADER, reason.encode()))
            headers.append((SOURCE_HEADER, f"{msg.topic()}/{msg.partition()}/{msg.offset()}".encode()))
            outbox.append((self.settings.dlq_topic, msg.key(), msg.value(), headers))
        backoff = Backoff(first=0.5, cap=10.0)
        while outbox:
            failed: list = []

            def delivered(err, _msg, item=None):
                if err is not None:
                    failed.append((item, err))

            for item in outbox:
                produce(self.producer, item[0], item[2], item[1], item[3],
                        lambda err, m, item=item: delivered(err, m, item))
            while self.producer.flush(1.0) > 0:
                if not self.life.running and self.life.hard_stop:
                    return False
            if not failed:
                self.producer_outage.ok()
                return True
            self.throttle.warning("publish", "%d publishes failed (%s); retrying", len(failed), failed[0][1].str())
            if any(err.fatal() for _, err in failed):
                self.producer, self.producer_outage = make_producer(self.settings, "consumer producer")
            outbox = [item for item, _ in failed]
            if not self.life.sleep(backoff.failed()):
                return False
        return True

    def commit(self, messages: list[Message], *, wait: bool = False) -> None:
        """Commit the batch's offsets. Asynchronous while running (the batch is already durable, so a
        lost commit only means a re-read, which the store ignores); the last one is waited for."""
        offsets = commit_offsets(messages)
        self.uncommitted.update({(tp.topic, tp.partition): tp for tp in offsets})
        try:
            self.consumer.commit(offsets=list(self.uncommitted.values()), asynchronous=not wait)
            self.uncommitted.clear()
        except Exception as exc:  # noqa: BLE001 - a failed commit only means a re-read; the store is idempotent
            self.throttle.warning("commit", "offset commit failed (%s); the batch may be read again", exc)

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
            delay = self.db_backoff.failed()
            self.throttle.warning("db", "postgres unavailable (%s); retrying in %.1fs", exc, delay)
            self.next_ping = now + delay
            return
        self.db_recovered()
        self.next_ping = now + 1.0

    def wait_for_store(self, exc: StoreUnavailable) -> bool:
        delay = self.db_backoff.failed()
        self.throttle.warning("db", "postgres unavailable (%s); retrying in %.1fs", exc, delay)
        return self.life.sleep(delay)

    def db_recovered(self) -> None:
        lasted = self.db_backoff.succeeded()
        if lasted is not None:
            log.warning("postgres reachable again after %.1fs", lasted)

    def close(self) -> None:
        log.info("stopping: consumed %(consumed)d, enqueued %(enqueued)d, late %(late)d, dead-lettered %(dead)d, "
                 "duplicates %(duplicates)d, replaced %(replaced)d, cancelled %(cancelled)d, cancels of ids not "
                 "waiting %(cancel_unknown)d", self.stats)
        self.metrics.close()  # first: its probe thread uses a Kafka client
        if self.last_batch:
            self.commit(self.last_batch, wait=True)
        try:
            self.consumer.close()
        except Exception as exc:  # noqa: BLE001 - closing is best effort; offsets are already committed
            log.warning("closing the Kafka consumer: %s", exc)
        self.producer.flush(5.0)
        self.store.close()


def run(settings: Settings, node_id: uuid.UUID, life: Lifecycle) -> None:
    ConsumerProcess(settings, node_id, life).run()
