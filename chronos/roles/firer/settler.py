"""The settler: the firer's thread that settles held rows in the store as the sender reports what
became of them, ends the batches of the claim that deletes, and measures the database clock."""

from __future__ import annotations

import logging
import queue
import time
from typing import Sequence

from chronos.config import Settings
from chronos.errors import StoreUnavailable
from chronos.telemetry.metrics import FirerTelemetry
from chronos.ports import SettleStore
from chronos.domain.model import Claimed
from chronos.roles.firer.batches import Batch, HeldBatches
from chronos.roles.firer.handoff import Outcomes, Shared, Stop, ToSettle, size_of
from chronos.roles.firer.store_thread import StoreThread
from chronos.runtime.process import Lifecycle

log = logging.getLogger("chronos.firer")

DELETE_BATCH = 1000          # acknowledged rows deleted in one statement at most
DELETE_EVERY = 0.02          # seconds between deletes while acknowledgements trickle in
CLOCK_SYNC_EVERY = 10.0      # seconds between measurements of the database clock offset


class Settler(StoreThread[SettleStore]):
    """The settler: settles held rows as the sender reports their outcomes (`inbox`): deletes the
    acknowledged ones in batches, hands back, retries later, deletes as dead-lettered or parks
    the others. On its own thread and connection, never behind a claim, which is why it also
    measures the database clock for the sender (`sync_clock`).

    A row of the claim that deletes (`Claimed.batch`) is settled in its batch (`batches`): once every
    row of a batch is, its transaction commits, with the rows to hand back, retry or park put there
    first (`end`), or, when none of them went anywhere, rolls back."""

    def __init__(self, store: SettleStore, settings: Settings, shared: Shared, telemetry: FirerTelemetry, life: Lifecycle,
                 batches: HeldBatches | None = None):
        super().__init__("settler", store, settings, shared, telemetry, life)
        self.batches = batches
        self.inbox: ToSettle = queue.SimpleQueue()
        self.todo = Outcomes()
        self.stopping = False
        self.next_clock_sync = 0.0
        self.last_delete = 0.0
        self.down_until = 0.0

    def loop(self) -> None:
        while True:
            self.receive(self.wait_time())
            now = time.time()
            if now < self.down_until:
                continue
            try:
                asked = time.monotonic()
                self.settle(now)
                if self.stopping:
                    if not self.todo:
                        self.metrics.withdraw(self.store)
                        return
                    continue
                if now >= self.next_clock_sync:
                    self.sync_clock(now)
                self.metrics.announce(self.store, time.monotonic())
                if self.store.last_ok >= asked:  # a pass that ran no statement says nothing of PostgreSQL
                    self.outage.ok()
            except StoreUnavailable as exc:
                if self.stopping and self.outage.down_for() > 5:
                    log.warning("postgres unavailable at shutdown (%s): %d held rows will be taken over "
                                "after the hold time", exc, self.todo.count())
                    return
                self.down_until = time.time() + self.outage.failed(exc)

    def wait_time(self) -> float:
        now = time.time()
        if now < self.down_until:  # PostgreSQL is away: nothing to do before the next try
            return min(self.down_until - now, 1.0)
        wake = now + 1.0 if self.stopping else self.next_clock_sync
        if self.todo.acked:
            wake = min(wake, self.last_delete + DELETE_EVERY)
        if self.todo.pending() or (self.stopping and self.todo.acked):
            wake = now
        return max(0.0, min(wake - now, 1.0))

    def receive(self, timeout: float) -> None:
        """Take what the sender sent: outcomes, or the stop."""
        try:
            item = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, Stop):
                self.stopping = True
            else:
                self.todo.add(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def settle(self, now: float) -> None:
        """Delete acknowledged rows in batches, hand back rows that will not be published, and settle
        failed ones: retried later, deleted once dead-lettered, or parked."""
        todo, totals = self.todo, self.shared.totals
        if self.batches is not None:
            self.settle_held(todo)
        if todo.release:
            totals.released += self.store.release(todo.release)
            self.count_settled(todo.release)
            todo.release = []
        if todo.retry:
            totals.retried += self.store.retry_later(todo.retry)
            self.count_settled([row for row, _, _ in todo.retry])
            todo.retry = []
        if todo.dead:
            totals.dead += self.store.delete_fired([row for row, _ in todo.dead])
            self.metrics.dead_lettered(reason for _, reason in todo.dead)
            self.count_settled([row for row, _ in todo.dead])
            todo.dead = []
        if todo.park:
            totals.parked += self.store.park_claimed(todo.park, self.settings.output_topic)
            for row, reason in todo.park:
                log.warning("parked %s in chronos_parked: neither %s nor the dead-letter topic %s took it (%s)",
                            row.id, row.topic or self.settings.output_topic, self.settings.dlq_topic, reason)
            self.count_settled([row for row, _ in todo.park])
            todo.park = []
        if not todo.acked or (len(todo.acked) < DELETE_BATCH and now - self.last_delete < DELETE_EVERY
                              and not self.stopping):
            return
        self.last_delete = now
        while todo.acked:
            done = todo.acked[:DELETE_BATCH]
            started = time.perf_counter()
            deleted = self.store.delete_fired(done)
            del todo.acked[:DELETE_BATCH]
            self.count_settled(done)
            self.measured("delete", len(done), started)
            totals.fired += len(done)
            if deleted < len(done):
                totals.vanished += len(done) - deleted
                self.throttle.warning("vanished", "%d published rows were no longer ours to delete "
                                      "(taken over by a peer after the hold time)", len(done) - deleted)

    def settle_held(self, todo: Outcomes) -> None:
        """Take the rows of held batches out of `todo`, each into its batch, and end every batch whose rows
        are all settled now."""
        assert self.batches is not None
        get = self.batches.get
        touched: dict[int, Batch] = {}
        held: list[Claimed] = []

        def batch_of(row: Claimed) -> Batch:
            held.append(row)
            batch = touched.get(row.batch)
            if batch is None:
                batch = touched[row.batch] = get(row.batch)
            return batch

        left: list = []
        for row in todo.acked:
            if row.batch:
                batch_of(row).fired += 1
            else:
                left.append(row)
        todo.acked, left = left, []
        for row, reason in todo.dead:
            if row.batch:
                batch_of(row).dead.append(reason)
            else:
                left.append((row, reason))
        todo.dead, left = left, []
        for row in todo.release:
            if row.batch:
                batch_of(row).restore.append(row)
            else:
                left.append(row)
        todo.release, left = left, []
        for item in todo.retry:
            if item[0].batch:
                batch_of(item[0]).retry.append(item)
            else:
                left.append(item)
        todo.retry, left = left, []
        for parked in todo.park:
            if parked[0].batch:
                batch_of(parked[0]).park.append(parked)
            else:
                left.append(parked)
        todo.park = left
        if not held:
            return
        self.count_settled(held)
        for batch in touched.values():
            if batch.done:
                self.end(batch)

    def end(self, batch: Batch) -> None:
        """End a batch whose rows are all settled: commit it with the rows to hand back, retry or park put
        there first, or roll it back when none of its rows went anywhere. A transaction that ended already
        (held past the hold time, or PostgreSQL lost) has every row back: those published fire again."""
        assert self.batches is not None
        totals = self.shared.totals
        started = time.perf_counter()
        try:
            if batch.changes:
                batch.session.finish(batch.restore, batch.retry, batch.park, self.settings.output_topic)
            else:
                batch.session.give_back()
        except StoreUnavailable as exc:
            totals.vanished += batch.fired
            self.throttle.warning("batch ended", "a batch of %d rows could not be committed (%s): those %d "
                                  "published will be published again", batch.size, exc, batch.fired)
            return
        finally:
            self.batches.ended(batch)
        self.measured("delete", batch.size, started)  # the commit: the batch's rows deleted for good
        totals.fired += batch.fired
        totals.released += len(batch.restore)
        totals.retried += len(batch.retry)
        totals.dead += len(batch.dead)
        totals.parked += len(batch.park)
        if batch.dead:
            self.metrics.dead_lettered(batch.dead)
        for row, reason in batch.park:
            log.warning("parked %s in chronos_parked: neither %s nor the dead-letter topic %s took it (%s)",
                        row.id, row.topic or self.settings.output_topic, self.settings.dlq_topic, reason)

    def count_settled(self, rows: Sequence[Claimed]) -> None:
        """These rows are no longer held: counted, and their size, which the claimer's caps read."""
        self.shared.settled_bytes += size_of(rows)
        self.shared.settled += len(rows)

    def sync_clock(self, now: float) -> None:
        """Measure the database clock's offset (`PublishTiming.observe_clock`), which the sender turns
        deadlines into local times with, every `CLOCK_SYNC_EVERY` seconds."""
        self.next_clock_sync = now + CLOCK_SYNC_EVERY
        self.store.db_clock_us()  # (re)connect first if need be: a connect inside the measurement skews it
        before = time.time()
        db_us = self.store.db_clock_us()
        self.shared.timing.observe_clock(db_us, before, time.time())
