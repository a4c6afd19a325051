"""`chronos firer`: store → output topic at each message's deadline.

Claims due rows (and rows due within the lookahead) in batches with one `UPDATE ... RETURNING`,
publishes each from memory at its deadline less the measured publish latency (never more than the
timing advance), waits for Kafka's acknowledgement, then deletes exactly the acknowledged rows it
still owns. Unpublished rows are handed back on shutdown. A publish that fails goes through one path
(`Sender.publish_failed`): a refusal that may pass is retried with exponential backoff, kept in
PostgreSQL (the row's `attempts` and moved `deadline`), up to CHRONOS_MAX_PUBLISH_ATTEMPTS; a
permanent one (too large, invalid), an exhausted one and a destination the allow-list no longer
allows go to the dead-letter topic; what even the dead-letter topic refuses is parked in
`chronos_parked`.

Three kinds of thread, each on what it alone owns, handing rows on through queues; what else they
read of each other is in `Shared`:

    claimers ──claims (rows)──► sender ──Outcomes, then Stop──► settler
    a store each                the producer (ProducerSlot)     a store of its own

- the claimers (`claimer.Claimer`, threads `claimer`, `claimer2` ...: CHRONOS_FIRER_CLAIMERS of
  them, one under fire-rate limits) claim rows: pacing, back-pressure, the cap on held rows (one for
  the firer), recurring schedules (the first). Each claims its own part of the firer's slices, so
  the next claim is on its way while the last one's rows are published; a claim that runs long stops
  only its claimer's further claims. With the claim that deletes (and no fire-rate limits) each claimer's
  full claims, which walk the due index from its head, run on a thread of their own (`sweeper.Sweeper`,
  threads `sweeper`, `sweeper2` ...), below the mark the claimer's last claim left;
- the sender (`sender.Sender`, on the thread that calls `FirerProcess.run`, named `sender`
  meanwhile) holds the rows in publishing order (`held.Held`, which also sets apart the rows
  claimed too long ago), publishes each at its deadline (`decisions.PublishTiming`), serves the
  delivery reports, replaces a producer at fault (`ProducerSlot`) and sends the settler what became
  of each row;
- the settler (`settler.Settler`, thread `settler`) settles them: deletes the acknowledged and the
  dead-lettered rows, hands back, retries later, parks. Its connection never waits behind a claim,
  so it also measures the database clock, which the sender turns deadlines into local times with.

A row is *held* from its claim until it is settled; the SQL marks it with `readied_at`. With
CHRONOS_FIRER_CLAIM=delete the claim deletes its rows instead, in a transaction held open on a session of
the firer's (`batches.HeldBatches`: one per batch in flight) until the settler has settled every row of
the batch and commits it, or rolls it back; PostgreSQL ends the transaction of a firer silent for the hold
time, and its rows are back. Recurring schedules' occurrences are stamped either way. What the threads
hand each other is in `handoff`; the decisions that depend on no thread (failure policy, retry delay,
publish timing) in `decisions`. `FirerProcess` wires the three and stops them in order.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from chronos.config import Settings
from chronos.domain.model import Claimed
from chronos.domain.ratelimit import cell_share
from chronos.errors import CellsUnsupported, ConfigError, KafkaUnanswered, StoreUnavailable
from chronos.telemetry.metrics import FirerTelemetry, postgres_reached
from chronos.ports import KafkaOutage, Publisher, Store, TakeStore
from chronos.roles.firer.batches import HeldBatches
from chronos.roles.firer.claimer import Claimer
from chronos.roles.firer.claiming import MAX_HELD_BATCHES
from chronos.roles.firer.decisions import PublishTiming
from chronos.roles.firer.handoff import Shared, Stop
from chronos.roles.firer.sender import Sender
from chronos.roles.firer.settler import Settler
from chronos.roles.firer.store_thread import StoreThread
from chronos.roles.firer.sweeper import Sweeper
from chronos.runtime.process import Lifecycle
from chronos.runtime.producer import ProducerSlot, ProducerWatch

log = logging.getLogger("chronos.firer")

__all__ = ["FirerProcess"]


class FirerProcess:
    """The firer: the state its threads share, its producer and its three threads, wired. `run`
    starts the claimers and the settler, runs the sender on the calling thread until the process
    stops, then stops all three in order (`shutdown`)."""

    def __init__(self, settings: Settings, life: Lifecycle, *, stores: Callable[[], Store],
                 producers: Callable[[], tuple[Publisher, KafkaOutage]], telemetry: FirerTelemetry,
                 takes: Callable[[], TakeStore] | None = None):
        """`stores` makes one store per thread (a store is one connection, not thread-safe);
        `producers` makes a Kafka producer and the log of its outages, again after a fatal error; `takes`
        makes a session for the claim that deletes (CHRONOS_FIRER_CLAIM=delete), one per batch in flight."""
        self.settings, self.life, self.stores, self.metrics = settings, life, stores, telemetry
        self.input_partitions: int | None = None  # the input topic's, as Kafka last said (cells' rate shares)
        self.share: float | None = None           # of the fire-rate limits, this cell's firers' as last worked out
        self.slot = ProducerSlot(producers, ProducerWatch("the firer", settings.publish_stall_ms / 1000.0,
                                                          time.monotonic()))
        self.shared = Shared(PublishTiming(settings.timing_advance_ms))
        self.batches: HeldBatches | None = None
        if settings.firer_claim == "delete":
            if takes is None:
                raise ConfigError("CHRONOS_FIRER_CLAIM=delete: this firer was given no sessions to hold its batches on")
            self.batches = HeldBatches(takes, MAX_HELD_BATCHES)
        self.settler = Settler(stores(), settings, self.shared, telemetry, life, self.batches)
        self.sender = Sender(settings, life, self.slot, self.shared, telemetry, outbox=self.settler.inbox)
        # fire-rate limits claim topic by topic over every slice, each topic's budget at a time: one claimer
        parts = 1 if settings.fire_rates else settings.firer_claimers
        lead = stores()
        self.claimer = Claimer(lead, settings, self.shared, telemetry, life, outbox=self.sender.inbox,
                               kafka_answers=lambda: self.slot.producer.answers(), parts=parts, batches=self.batches,
                               cell_share=(lambda: self.cell_share(lead)) if settings.cells else None)
        self.claimers = [self.claimer] + [
            Claimer(stores(), settings, self.shared, telemetry, life, outbox=self.sender.inbox, part=part,
                    parts=parts, lead=self.claimer, batches=self.batches) for part in range(1, parts)]
        # the claim that deletes without fire-rate limits: each claimer's full claims on a thread of their own
        batches = self.batches
        self.sweepers = [] if batches is None or settings.fire_rates else [
            Sweeper(claimer, stores(), batches) for claimer in self.claimers]
        self.metrics.follow(self.shared.totals.as_dict)
        self.metrics.follow_timing(lambda: len(self.sender.held) + self.shared.in_flight, self.shared.timing)
        self.metrics.follow_producer(self.slot.watch)
        self.metrics.follow_postgres(lambda: [self.settler.store.link] + [c.store.link for c in self.claimers])

    def cell_share(self, store: Store) -> float | None:
        """The share of the fire-rate limits this firer's cell takes (`ratelimit.cell_share`): the partitions its
        database lists open, over the input topic's as Kafka says it (the last known while Kafka does not)."""
        try:
            self.input_partitions = self.slot.producer.partitions(self.settings.input_topic, timeout=2.0) \
                or self.input_partitions
        except KafkaUnanswered as exc:
            log.info("kafka does not say how many partitions %s has (%s): the fire-rate limits' share is worked out "
                     "from the count known", self.settings.input_topic, exc)
        try:
            listed = store.cell_partitions()
        except CellsUnsupported as exc:  # a database before cells owns every partition
            log.warning("fire-rate limits: %s; this firer takes the whole of each", exc)
            return None
        share = cell_share(listed, self.input_partitions)
        if share != self.share:
            self.share = share
            log.info("fire-rate limits: this cell's firers take %s of each", "all" if share is None else f"{share:.4g}")
        return share

    def run(self) -> None:
        log.info("firing from the store to %s: batch %d, lookahead %d ms, poll %d ms, timing advance %d ms, "
                 "%d claimers, claims that %s", self.settings.output_topic, self.settings.batch_size,
                 self.settings.lookahead_ms, self.settings.poll_interval_ms, self.settings.timing_advance_ms,
                 len(self.claimers), "stamp" if self.batches is None else
                 f"delete (a session per batch in flight, {MAX_HELD_BATCHES} at most)")
        # `last_ok` is a float the claimers and the settler write: reading it uses no connection
        self.metrics.serve(postgres=lambda: postgres_reached(self.settler.store, *(c.store for c in self.claimers)),
                           kafka=lambda: self.slot.producer, kafka_topic=self.settings.output_topic)
        self.settler.start()
        for claimer in [*self.claimers, *self.sweepers]:
            claimer.start()
        thread = threading.current_thread()
        name, thread.name = thread.name, "sender"
        try:
            self.sender.loop()
        finally:
            self.shutdown()
            thread.name = name
        store_threads: list[StoreThread] = [self.settler, *self.claimers, *self.sweepers]
        for store_thread in store_threads:
            if isinstance(store_thread.crashed, ConfigError):
                raise store_thread.crashed
            if store_thread.crashed is not None:
                raise RuntimeError(f"the firer's {store_thread.name} failed") from store_thread.crashed

    def shutdown(self) -> None:
        """Stop claiming (the claims running are cancelled), hand back what was not published, wait for
        acknowledgements, delete what was fired."""
        claiming: list[Claimer | Sweeper] = [*self.claimers, *self.sweepers]
        for thread in claiming:
            thread.stop()
        give_up_at = time.monotonic() + 10.0
        for thread in claiming:
            if thread.is_alive():
                thread.join(max(0.0, give_up_at - time.monotonic()))
        self.sender.hand_back_unpublished()
        self.sender.finish_in_flight(10.0)
        self.settler.inbox.put(Stop())
        self.settler.join(30.0)
        # claimed after the stop was asked (a claim that would not end): hand those back too
        self.release_leftovers([row for row in self.sender.leftovers() if not row.batch])
        if self.batches is not None:
            if self.settler.is_alive():
                log.warning("the settler has not ended: PostgreSQL hands the batches it holds back after the hold time")
            else:  # batches left open (leftovers, reports that never came) are rolled back: their rows are back
                self.batches.close()
        log.info("stopping: claimed %(claimed)d, fired %(fired)d, vanished %(vanished)d, handed back %(released)d "
                 "(held too long: %(expired)d), retried later %(retried)d, dead-lettered %(dead)d, parked %(parked)d",
                 self.shared.totals.as_dict())
        self.metrics.close()

    def release_leftovers(self, rows: list[Claimed]) -> None:
        """Hand back rows claimed after the settler was told to stop, on a store of the sender's
        thread; if the settler has not ended, leave them to the detector."""
        if not rows:
            return
        if self.settler.is_alive():
            log.warning("the settler has not ended: %d held rows will be taken over after the hold time", len(rows))
            return
        store = self.stores()
        try:
            self.shared.totals.released += store.release(rows)
        except StoreUnavailable as exc:
            log.warning("postgres unavailable at shutdown (%s): %d held rows will be taken over after the hold time",
                        exc, len(rows))
        finally:
            store.close()

