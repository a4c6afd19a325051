"""The consumer's process: its parts wired, and its loop (read a batch, sort it, have it written,
commit it once durable)."""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping

from chronos.config import Settings
from chronos.domain.intake import Rules
from chronos.errors import StoreUnavailable
from chronos.telemetry.metrics import ConsumerTelemetry, postgres_reached
from chronos.ports import GroupWatcher, InputConsumer, InputMessage as Message, IntakeStore, KafkaOutage, Publisher
from chronos.roles.consumer.cells import CellBatches, Cells, Written
from chronos.roles.consumer.group import KAFKA, KAFKA_PROBE_S, Group, OutOfReach, PartitionsLost
from chronos.roles.consumer.late import LatePath
from chronos.roles.consumer.sorting import Batch, sort_batch
from chronos.roles.consumer.writer import Writer
from chronos.runtime.backoff import Backoff, POSTGRES_RETRY_CAP_S, Outage
from chronos.runtime.process import Lifecycle
from chronos.runtime.producer import ProducerSlot, ProducerWatch

log = logging.getLogger("chronos.consumer")


class ConsumerProcess:
    """The consumer's loop: read a batch, sort it, make it durable, commit its offsets."""

    def __init__(self, settings: Settings, life: Lifecycle, *, store: IntakeStore,
                 producers: Callable[[], tuple[Publisher, KafkaOutage]],
                 consumers: Callable[[Callable], tuple[InputConsumer, KafkaOutage]], telemetry: ConsumerTelemetry,
                 watchers: Callable[[], GroupWatcher], clock: Callable[[], float] = time.monotonic,
                 cells: Mapping[str, IntakeStore] | None = None):
        """`producers` makes a Kafka producer and the log of its outages (again after a fatal error);
        `consumers(on_commit)` makes the input topic's consumer, reporting commits to `on_commit`;
        `watchers()` a client of the group that never joins it (`Group`); `clock` measures PostgreSQL's
        and Kafka's outages against the hold time. With `cells` (each cell's store by name, in order; `store`
        the first's), each message is written to the cell of its input partition (`Cells`)."""
        self.settings, self.life = settings, life
        self.rules = Rules.from_settings(settings)
        self.store = store
        self.stores = dict(cells) if cells else {"": store}
        self.db_outage = Outage(log, cap=POSTGRES_RETRY_CAP_S, clock=clock)
        self.slot = ProducerSlot(producers, ProducerWatch("the consumer", settings.publish_stall_ms / 1000.0,
                                                          time.monotonic()))
        self.stats = {"consumed": 0, "enqueued": 0, "late": 0, "dead": 0, "duplicates": 0, "replaced": 0,
                      "cancelled": 0, "cancelled_in_flight": 0, "cancel_unknown": 0, "parked": 0, "forwarded": 0}
        self.metrics = telemetry
        self.group = Group(settings, life, telemetry, consumers=consumers, watchers=watchers, clock=clock)
        late = LatePath(settings, life, slot=self.slot, store=store, group=self.group, db_outage=self.db_outage,
                        stats=self.stats, clock=clock)
        self.writer = Writer(settings, life, store=store, group=self.group, late=late, db_outage=self.db_outage,
                             telemetry=telemetry, stats=self.stats, clock=clock)
        self.cells: Cells | None = None
        if cells:
            writers = {cell: Writer(settings, life, store=cell_store, group=self.group, late=late,
                                    db_outage=Outage(log, f"postgres of cell {cell}", cap=POSTGRES_RETRY_CAP_S,
                                                     clock=clock),
                                    telemetry=telemetry, stats=self.stats, clock=clock)
                       for cell, cell_store in cells.items()}
            self.cells = Cells(settings, life, writers=writers, rules=self.rules, group=self.group, clock=clock,
                               partitions=lambda: self.slot.producer.partitions(settings.input_topic))
            late.keep_parked = self.cells.park  # each parked message in its partition's cell
        self.metrics.follow(lambda: self.stats)
        self.metrics.follow_producer(self.slot.watch)
        self.metrics.follow_postgres(lambda: [s.link for s in self.stores.values()],
                                     cells=(lambda: {cell: [s.link] for cell, s in self.stores.items()}) if cells
                                     else None)
        if self.cells is not None:
            self.metrics.follow_cells(self.stores, self.cells.is_down)

    def run(self) -> None:
        """Read batch N+1 (and sort it) while batch N is written on the writer thread; commit N's
        offsets once N is durable, and never before, so offsets are committed in order."""
        if self.cells is not None and not self.cells.load():
            self.close()
            return
        self.group.subscribe()
        log.info("consuming %s (group %s), batch %d", self.settings.input_topic, self.settings.consumer_group,
                 self.settings.batch_size)
        # the producer answers metadata requests at once; the group consumer may take seconds
        self.metrics.serve(postgres=(lambda: postgres_reached(self.store)) if self.cells is None else
                           {cell: functools.partial(postgres_reached, s) for cell, s in self.stores.items()},
                           postgres_detail=self.group.out_of_group,
                           kafka=lambda: self.slot.producer, kafka_topic=self.settings.input_topic)
        # the store, the producer and the stats are the writer's while a batch is pending
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="consumer-writer")
        pending: tuple[Future, list[Message], int] | None = None
        try:
            while self.life.running:
                messages = self.group.consumer.consume(num_messages=self.settings.batch_size, timeout=0.05)
                self.metrics.beat()
                self.group.sample_lag(time.monotonic())
                if self.cells is not None:
                    self.cells.reach.note(self.cells.down)
                real = self.group.readable(messages)
                epoch = self.group.losses  # after the poll: a loss it reported came before these messages
                batch: Batch | CellBatches | None = None
                if real:
                    now_us = time.time_ns() // 1000
                    batch = sort_batch(real, now_us, self.rules) if self.cells is None else self.cells.sort(real, now_us)
                if pending is not None and (real or pending[0].done()):
                    done, pending = pending, None
                    try:
                        durable = self.finish(*done, pending_batch=batch)
                    except OutOfReach as exc:
                        # the batch read meanwhile (`real`) follows the given-up one: committing it would
                        # skip that one, so it is given up too, and read again with it
                        if self.cells is not None:
                            self.cells.forget_down()
                        if not self.group.sit_out(exc, len(done[1]) + len(real), self.wait_for):
                            break
                        continue
                    except PartitionsLost:
                        log.warning("gave up a batch of %d messages read before the group's session was lost: "
                                    "not written, not committed; whoever holds its partitions reads it again",
                                    len(done[1]))
                        durable = True  # nothing of it to wait for
                    if not durable:
                        break  # stopped before that batch was durable: it is read again
                if self.cells is not None and pending is None:
                    self.cells.look_after_moving()
                    try:
                        self.cells.look_after()
                    except OutOfReach as exc:
                        # the batch read meanwhile is given up with the partitions, and read again by their owner
                        self.cells.forget_down()
                        if not self.group.sit_out(exc, len(real), self.wait_for):
                            break
                        continue
                if isinstance(batch, Batch):
                    self.group.outage.ok()
                    pending = (writer.submit(self.writer.write, real, batch, epoch), real, epoch)
                elif batch is not None:
                    assert self.cells is not None  # sorted by cell
                    self.group.outage.ok()
                    pending = (writer.submit(self.cells.write, real, batch, epoch), real, epoch)
                elif pending is None and not messages:
                    self.writer.keep_alive() if self.cells is None else self.cells.keep_alive()
            if pending is not None:
                try:
                    self.finish(*pending)
                except (OutOfReach, PartitionsLost) as exc:
                    log.warning("stopping: gave up the last batch (%s); it was not committed, so it is read again",
                                exc)
        finally:
            writer.shutdown(wait=True)
            self.close()

    def finish(self, written: Future, messages: list[Message], epoch: int,
               pending_batch: Batch | CellBatches | None = None) -> bool:
        """Wait for a batch's write; commit its offsets if it is durable and the group's session it was read
        in still holds (after a loss its partitions may be another consumer's, whose offsets a commit
        would move back). With cells, only the parts of the cells that answered are committed; the others are
        held back, with their part of the batch read meanwhile (`pending_batch`). False if it is not durable
        (stopped first); raises `OutOfReach` or `PartitionsLost` if the write gave it up."""
        result = written.result()
        if not result:
            return False
        if isinstance(result, Written):
            assert self.cells is not None  # written by cell
            messages = result.durable
            if result.down:
                self.cells.went_down(result, pending_batch if isinstance(pending_batch, CellBatches) else None)
            if result.moving:
                self.cells.moving.hold(result.moving)
        if self.group.losses != epoch or not messages:
            return True
        self.group.commit(messages)
        self.group.last_batch = messages
        return True

    def wait_for(self, service: str, delay: float) -> bool:
        """Out of the group: ask `service` with the outage's backoff until it answers (PostgreSQL the time,
        the cheapest statement; Kafka the cluster's metadata), serving the Kafka consumer in between; False
        if stopped first."""
        backoff = Backoff(first=max(delay, 0.1), cap=KAFKA_PROBE_S)
        while self.group.serve(delay):
            if service == KAFKA:
                if self.slot.producer.answers(KAFKA_PROBE_S):
                    return True
                delay = backoff.failed()
                continue
            try:
                for store in self.stores.values():  # with cells, every cell answers before it rejoins
                    store.db_clock_us()
            except StoreUnavailable as exc:
                delay = self.db_outage.failed(exc)
                continue
            self.db_outage.ok()
            return True
        return False

    def close(self) -> None:
        log.info("stopping: consumed %(consumed)d, enqueued %(enqueued)d, late %(late)d, dead-lettered %(dead)d, "
                 "duplicates %(duplicates)d, replaced %(replaced)d, cancelled %(cancelled)d, cancelled in flight "
                 "(may still be delivered) %(cancelled_in_flight)d, cancels of ids not waiting %(cancel_unknown)d, "
                 "cancels and replaces forwarded to their message's cell %(forwarded)d", self.stats)
        if self.cells is not None:
            self.cells.close()
        for store in self.stores.values():
            self.metrics.withdraw(store)  # the writer threads are done with the stores
        self.metrics.close()  # first of the clients: its probe thread uses a Kafka client
        self.group.close()
        self.slot.producer.flush(5.0)
        for store in self.stores.values():
            store.close()
