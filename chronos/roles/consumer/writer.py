"""The writer: a sorted batch made durable in the store (its late messages published, its invalid ones
dead-lettered: `LatePath`), through PostgreSQL's outages, on a thread of its own."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, ParamSpec, TypeVar, cast

from chronos.config import Settings
from chronos.domain.cells import Fence
from chronos.errors import StoreRejected, StoreUnavailable
from chronos.logs import Throttle
from chronos.telemetry.metrics import ConsumerTelemetry
from chronos.ports import InputMessage as Message, IntakeStore
from chronos.roles.consumer.group import POSTGRES, Group, OutOfReach, PartitionsLost
from chronos.roles.consumer.late import LatePath
from chronos.roles.consumer.one_by_one import apply_one_by_one
from chronos.roles.consumer.sorting import CANCEL, INSERT, REPLACE, Batch
from chronos.runtime.backoff import Outage
from chronos.runtime.process import Lifecycle

log = logging.getLogger("chronos.consumer")

CLOCK_EVERY_S = 10.0  # how often the consumer measures its host's clock against PostgreSQL's

P = ParamSpec("P")
T = TypeVar("T")


class Unreached(Exception):
    """A cell's PostgreSQL did not answer its part of a poll (failed, or gave no answer within
    CHRONOS_DATABASE_TIMEOUT_MS): nothing of it is known written."""


@dataclass(frozen=True, slots=True)
class Stored:
    """What writing a batch to the store did: the rows inserted, replaced, cancelled and cancelled in flight,
    and which of its late messages' ids are waiting there (they are duplicates, not published)."""

    inserted: int
    replaced: int
    cancelled: int
    in_flight: int
    waiting: set[str] = field(default_factory=set)


class Writer:
    """Writes the batches the loop sorted, one at a time, on the writer thread; between batches, keeps
    /healthz told whether PostgreSQL answers (`keep_alive`, on the loop's thread)."""

    def __init__(self, settings: Settings, life: Lifecycle, *, store: IntakeStore, group: Group, late: LatePath,
                 db_outage: Outage, telemetry: ConsumerTelemetry, stats: dict[str, int], clock: Callable[[], float]):
        """`clock` measures PostgreSQL's outages against the hold time."""
        self.settings, self.life, self.store, self.group, self.late = settings, life, store, group, late
        self.db_outage, self.metrics, self.stats, self.clock = db_outage, telemetry, stats, clock
        self.hold_s = settings.hold_time_ms / 1000.0
        self.throttle = Throttle(log)
        self.next_ping = 0.0
        self.next_clock = 0.0  # monotonic: when `measure_clock` reads the database's clock next
        # with cells: the cancels that found nothing and the replaces are noted to forward to the other cells,
        # which count the cancels that found nothing anywhere (`Forwarder.round`)
        self.forward = False

    def write(self, messages: list[Message], batch: Batch, epoch: int | None = None) -> bool:
        """Make one sorted batch durable and acknowledged; False if stopped before it was. Raises
        `OutOfReach`, the batch not written, once PostgreSQL has not answered for the hold time (or its late
        messages not published, once Kafka has acknowledged none of them for as long), and `PartitionsLost`
        before a try when the group's session was lost since the batch was read (`epoch`)."""
        stored = self.store_batch(batch, epoch)
        return stored is not None and self.finish(messages, [(batch, stored)])

    def store_batch(self, batch: Batch, epoch: int | None = None, fence: Fence | None = None, *,
                    give_up: bool = False) -> Stored | None:
        """A batch's store operations written, and which of its late messages' ids are waiting; None if stopped
        first. With a `fence` (cells), `CellMapChanged` when it does not hold, nothing written. Raises as
        `write` does; with `give_up` (a cell's part), `Unreached` at the first failure, instead of waiting
        PostgreSQL's outage out: the other cells' parts go on meanwhile; and before any try when the cell's
        last statement found it out of reach. Every statement of a cell runs on its thread, one at a time (the
        parts of the polls, the words of reach, the forwarded cancels, the clock's readings): a try of its own
        would wait out a deadline of its own first (a connection to open, on a network that drops the
        packets), and the cell's partitions would be paused that much later."""
        if give_up and self.last_failed:
            raise Unreached("the cell's last statement found it out of reach")
        unreached_since: float | None = None
        others_before: dict[int, int] | None = None
        while True:
            if epoch is not None and self.group.losses != epoch:
                raise PartitionsLost("the group's session was lost since it was read")
            tried = self.clock()
            try:
                started = time.perf_counter()
                try:
                    done = self.store.apply(batch.of(INSERT), batch.of(REPLACE), batch.of(CANCEL), fence,
                                            forward=self.forward)
                except StoreRejected as exc:
                    done = apply_one_by_one(self.store, batch, exc, fence, forward=self.forward)
                # late messages passed `decide`, so their headers are valid and carry an id
                waiting = self.store.waiting_ids(cast(str, p.message_id) for _, p in batch.late)
                break
            except StoreUnavailable as exc:
                if give_up:
                    self.db_outage.failed(exc)
                    raise Unreached(str(exc)) from None
                if unreached_since is None:
                    # out of reach since this first failed try at the latest (a statement PostgreSQL does not
                    # answer fails only CHRONOS_DATABASE_TIMEOUT_MS later), or since the idle probes failed
                    unreached_since = min(tried, self.clock() - self.db_outage.down_for())
                    others_before = self.group.progress()
                delay = self.db_outage.failed(exc)
                if not self.wait_to_retry(unreached_since, self.clock(), delay, others_before):
                    return None
        self.db_outage.ok()
        self.now_and_then(time.monotonic())
        if batch.ops:
            self.metrics.batch("insert", len(batch.ops), time.perf_counter() - started)
        return Stored(*done, waiting=waiting)

    def finish(self, messages: list[Message], parts: list[tuple[Batch, Stored]]) -> bool:
        """Once a poll's batches are stored (one per cell, with cells): their late messages whose id is not
        waiting published, their invalid ones dead-lettered, all acknowledged, and counted; False if stopped
        before Kafka acknowledged them."""
        late = [(m, p) for batch, stored in parts for m, p in batch.late if p.message_id not in stored.waiting]
        dead = [d for batch, _ in parts for d in batch.dead]
        started = time.perf_counter()
        refused = self.late.publish(late, dead)
        if refused is None:
            return False
        if late or dead:
            self.metrics.batch("publish", len(late) + len(dead), time.perf_counter() - started)
        if refused:
            self.metrics.dead_lettered(refused)
        s = self.stats
        s["consumed"] += len(messages)
        s["late"] += len(late) - len(refused)
        s["dead"] += len(dead) + len(refused)
        for batch, stored in parts:
            s["enqueued"] += stored.inserted
            s["duplicates"] += (batch.duplicates + (len(batch.of(INSERT)) - stored.inserted)
                                + sum(p.message_id in stored.waiting for _, p in batch.late))
            s["replaced"] += stored.replaced
            s["cancelled"] += stored.cancelled
            s["cancelled_in_flight"] += stored.in_flight
            if not self.forward:
                s["cancel_unknown"] += len(batch.of(CANCEL)) - stored.cancelled - stored.in_flight
        if dead:
            self.metrics.dead_lettered(r for _, r, _ in dead)
            reasons = sorted({r.split(":", 1)[0] for _, r, _ in dead})
            self.throttle.warning("dead", "%d invalid messages sent to %s (%s)", len(dead),
                                  self.settings.dlq_topic, ", ".join(reasons))
        return True

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
        self.now_and_then(now)

    def note_reach(self, ages_ms: dict[str, int]) -> dict[str, int] | None:
        """With cells, on the cell's thread: this consumer says in its cell how long ago it reached each cell,
        and reads how long ago the other consumers of its group did (`IntakeStore.note_reach`); an answer counts
        as the idle probe's does (`keep_alive`). StoreUnavailable as the store raises it."""
        others = self.store.note_reach(self.settings.consumer_group, ages_ms)
        self.db_outage.ok()
        self.now_and_then(time.monotonic())
        return others

    def now_and_then(self, now: float) -> None:
        """Once PostgreSQL answered (after a write, or an idle probe), on the thread that holds the store: the
        host's clock measured, and where the process serves /metrics said again, each when due; not the
        second once the first found PostgreSQL out of reach (its try would hold the thread, and the next
        write behind it, as long again)."""
        self.measure_clock(now)
        if not self.last_failed:
            self.metrics.announce(self.store, now)

    def unless_failed(self, statement: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """With cells, on the cell's thread: `statement`, unless the cell's last statement found it out of reach:
        then StoreUnavailable without a try. A try would open a connection first, which on a network that drops
        the packets waits out the connect timeout of each of the cell's servers, and the parts of the polls
        queued behind it on the thread would wait as long before finding the cell down; the cell's probe
        (`Cells.look_after`) is the statement that tries it again."""
        if self.last_failed:
            raise StoreUnavailable("the cell's last statement found it out of reach")
        return statement(*args, **kwargs)

    @property
    def last_failed(self) -> bool:
        """Whether the store's last statement found PostgreSQL out of reach (none answered since)."""
        return self.store.last_unanswered > self.store.last_ok

    def measure_clock(self, now: float) -> None:
        """Every CLOCK_EVERY_S, PostgreSQL's clock minus this host's, for
        `chronos_consumer_clock_offset_seconds`: the consumer decides by this host's clock whether a message
        is already due, so a host ahead of the database publishes messages early by as much. A statement that
        fails is only logged."""
        if now < self.next_clock:
            return
        self.next_clock = now + CLOCK_EVERY_S
        try:
            before = time.time()
            db_us = self.store.db_clock_us()
            after = time.time()
        except StoreUnavailable as exc:  # the next write or probe says whether PostgreSQL is out of reach
            log.debug("could not read PostgreSQL's clock: %s", exc)
            return
        self.metrics.clock_offset.set(db_us / 1e6 - (before + after) / 2)

    def wait_for_store(self, exc: StoreUnavailable) -> bool:
        """Wait out a PostgreSQL outage's backoff; False if stopped meanwhile."""
        return self.life.sleep(self.db_outage.failed(exc))

    def wait_to_retry(self, unreached_since: float, now: float, delay: float,
                      others_before: dict[int, int] | None) -> bool:
        """Wait `delay` (the outage's backoff) before writing a batch again, but not past the hold time
        since PostgreSQL was last reached (`unreached_since`, by `self.clock`); False if stopped meanwhile.
        Raises `OutOfReach` once the hold time is over and another consumer of the group has committed
        since the outage began (`others_before`: `Group.progress` then): the partitions go to a consumer
        that can serve them rather than wait here for as long as the outage lasts. While no other
        consumer commits (PostgreSQL is down for all of them, or this one is the only one), leaving would
        hand the partitions to nobody who can serve them: it goes on waiting, in the group."""
        down_for = now - unreached_since
        if down_for >= self.hold_s and self.life.running:
            if self.group.others_serve(others_before):
                raise OutOfReach(POSTGRES, down_for, delay)
            self.throttle.warning("alone", "cannot reach PostgreSQL for %.1fs, and no other consumer of group %s "
                                  "has committed since: staying in the group (no one else could serve its "
                                  "partitions)", down_for, self.settings.consumer_group)
            return self.life.sleep(delay)
        return self.life.sleep(max(0.0, min(delay, self.hold_s - down_for)))
