"""Moving an input partition from its cell to another, and adding a cell (`chronos cells move`, `chronos cells
add`): the steps of `chronos.domain.moves`, run over each cell's store, each one finished by whoever runs the
move again after it died half way (its progress is in the source cell's database, its lease says who runs it).

Nothing is lost: every row of the partition written after the watch began is noted in the source and carried
over as it stands; the rest is copied ahead or handed over at the cut-over. Nothing fires early or in both cells:
the copies wait dormant in the target until the partition froze in the source (where no firer claims a row of it
any more), and a row is handed over live only once no firer holds it (stamped, or taken by a claim that deletes
in a transaction still open). The other partitions do not pause: the
watch and the freeze are triggers of the moving partition's rows only, made under a short lock timeout.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from chronos import ports
from chronos.domain.cells import CellMap, ranges
from chronos.domain.moves import (COPYING, CUTTING_OVER, FINISHING, MoveBusy, MoveError, MoveRecord, Pace,
                                  share_for)

log = logging.getLogger("chronos.moves")

#: How much longer than the firers' lookahead the move's first wait for the table's lock lasts: a batch's
#: acknowledgement by Kafka and its commit.
ACK_MARGIN_MS = 100
CONSUMERS_SEEN_MS = 120_000  # a consumer that said where it serves /metrics this recently is running


class CellStore(ports.MoveStore, ports.CellMapStore, ports.IntakeStore, ports.DetectStore, ports.OperatorsStore,
                Protocol):
    """What a move asks of each cell's store."""


@dataclass(frozen=True)
class MoveSettings:
    """How a move goes: `ahead_ms`, rows due later than this from the move's start are copied ahead (the rest at
    the cut-over); `near_ms`, at the cut-over the rows due within this are handed over live and woken;
    `hold_ms` and `detection_ms`, the deployment's hold time and failure detection interval (how long a row a
    firer holds is waited for); `lease_ms`, how long the move's lease lasts unrenewed; `batch`, rows per
    statement at most; `rate`, rows a second the copy ahead, the waking and the deletion go at (0: as fast as
    the databases go; the cut-over is never held back)."""

    hold_ms: int = 5000
    detection_ms: int = 500
    ahead_ms: int = 10_000
    near_ms: int = 10_000
    lease_ms: int = 10_000
    batch: int = 5000
    rate: int = 0
    busy_retry_s: float = 0.2     # a table too busy for a trigger's change: tried again after this
    queue_after: int = 25         # tries that take the table's lock only if free at once, before those that wait
    # the first of those waits for the lock; each next one twice as long. A firer's claim that deletes holds its
    # batch's transaction from the claim, up to its lookahead before the rows are due, until Kafka acknowledged
    # them, so a shorter wait fails having held every write behind it: the firers' lookahead and an
    # acknowledgement's margin (CHRONOS_LOOKAHEAD_MS's default and ACK_MARGIN_MS; `first_wait_ms` for another)
    queue_first_ms: int = 300 + ACK_MARGIN_MS
    settle_poll_s: float = 0.05   # how often the cut-over looks whether rows are still held


def first_wait_ms(lookahead_ms: int) -> int:
    """The move's first wait for a busy table's lock where the firers claim `lookahead_ms` ahead."""
    return lookahead_ms + ACK_MARGIN_MS


@dataclass
class Moved:
    """What a move did: the partition, the cells, the epoch it opened at in the target, and the rows carried
    (copied ahead, changes carried over, handed over live, schedules, woken), and the cut-over's length: from
    the partition's close in the source to its opening in the target."""

    partition: int
    source: str
    target: str
    epoch: int = 0
    copied: int = 0
    carried: int = 0
    handed: int = 0
    schedules: int = 0
    woken: int = 0
    cut_over_s: float = 0.0
    already: bool = False  # the partition was in the target already: nothing to do


@dataclass
class Mover:
    """Runs moves over the cells' stores (by cell name, in CHRONOS_CELLS's order). `say` reports progress;
    `clock` and `sleep` are the machine's unless a test gives its own."""

    stores: Mapping[str, CellStore]
    settings: MoveSettings = field(default_factory=MoveSettings)
    say: Callable[[str], None] = lambda line: None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    node: uuid.UUID = field(default_factory=uuid.uuid4)
    _renewed: float = 0.0  # when the lease was last renewed

    # -- where things stand ------------------------------------------------------------------------

    def cell_map(self) -> CellMap:
        return CellMap.build({cell: store.cell_partitions() for cell, store in self.stores.items()})

    def records(self) -> dict[int, tuple[str, MoveRecord]]:
        """The moves recorded in every cell: partition -> (its source cell, its record)."""
        return {r.partition: (cell, r) for cell, store in self.stores.items() for r in store.moves()}

    def _store(self, cell: str) -> CellStore:
        if cell not in self.stores:
            raise MoveError(f"no cell {cell!r} in CHRONOS_CELLS (the cells are {', '.join(self.stores)})")
        return self.stores[cell]

    # -- one partition -------------------------------------------------------------------------------

    def move(self, partition: int, target: str, *, check: bool = True) -> Moved:
        """Move `partition` to `target`, or finish its move there begun before. With `check`, the target must
        have a live firer and every running consumer must write to it (else MoveError, nothing done)."""
        target_store = self._store(target)
        recorded = self.records().get(partition)
        if recorded is None:
            owner = self.cell_map().owner(partition)
            if owner.cell == target and owner.writable:
                self.say(f"partition {partition} is in cell {target} already")
                return Moved(partition, target, target, owner.epoch, already=True)
            if not owner.writable:
                raise MoveError(f"partition {partition} is closed in cell {owner.cell} and no move of it is recorded "
                                f"there: a move of it ended badly; open it again in its cell")
            source = owner.cell
            if check:
                self.check_target(source, target)
            self.stores[source].begin_move(partition, target, self.node, self.settings.ahead_ms)
            self.say(f"moving partition {partition} from cell {source} to cell {target}")
        else:
            source, record = recorded
            if record.target != target:
                raise MoveError(f"partition {partition} is on its way to cell {record.target}: run the move to "
                                f"{record.target} again to finish it first")
            self.say(f"finishing the move of partition {partition} from cell {source} to cell {target}, "
                     f"{record.step} when it stopped")
        moved = Moved(partition, source, target)
        self.take_lease(partition, source)
        record = self._record(partition, source)
        if record.step == COPYING:
            self.copy(moved, record)
            record = self._save(moved, CUTTING_OVER, 0)
        if record.step == CUTTING_OVER:
            self.cut_over(moved, record)
            record = self._save(moved, FINISHING, 0)
        self.finish(moved, record, target_store)
        return moved

    def check_target(self, source: str, target: str) -> None:
        """MoveError unless a firer serves the target and every consumer running writes to it too."""
        source_store, target_store = self.stores[source], self.stores[target]
        if target_store.live_firers(self.settings.hold_ms) == 0:
            raise MoveError(f"no firer serves cell {target} (none renewed its lease within the hold time): start "
                            f"its firers before moving partitions to it")
        running = {a.node for a in source_store.announced(CONSUMERS_SEEN_MS) if a.role == "consumer"}
        knowing = {a.node for a in target_store.announced(CONSUMERS_SEEN_MS) if a.role == "consumer"}
        if running - knowing:
            raise MoveError(f"consumer(s) {', '.join(sorted(running - knowing))} do not write to cell {target}: "
                            f"restart them with it in CHRONOS_CELLS before moving partitions to it")

    def take_lease(self, partition: int, source: str) -> None:
        """Hold the move's lease, waiting for another runner's to expire (MoveBusy if it is renewed meanwhile)."""
        store = self.stores[source]
        waited_from = self.clock()
        while not store.lease_move(partition, self.node, self.settings.lease_ms):
            if self.clock() - waited_from > 2 * self.settings.lease_ms / 1000.0:
                raise MoveBusy(f"another `chronos cells move` runs the move of partition {partition} now")
            self.say(f"the move of partition {partition} was run by another command lately: waiting for its lease "
                     f"to expire")
            self.sleep(1.0)

    def _record(self, partition: int, source: str) -> MoveRecord:
        for record in self.stores[source].moves():
            if record.partition == partition:
                return record
        raise MoveError(f"the move of partition {partition} is no longer recorded in cell {source}")

    def _save(self, moved: Moved, step: str, cursor: int) -> MoveRecord:
        if not self.stores[moved.source].save_move(moved.partition, self.node, step, cursor):
            raise MoveBusy(f"another `chronos cells move` took the move of partition {moved.partition} over")
        self._renewed = self.clock()
        return self._record(moved.partition, moved.source)

    def renew(self, moved: Moved, step: str, cursor: int = 0) -> None:
        """Renew the move's lease (with its step and cursor as they are) once a second at most."""
        if self.clock() - self._renewed >= 1.0:
            self._save(moved, step, cursor)
            self._renewed = self.clock()

    def _paced(self, pace: Pace, rows: int) -> None:
        """Wait as long as the move's rate asks after `rows` more."""
        wait = pace.after(rows, self.clock())
        if wait > 0:
            self.sleep(wait)

    def _until_done(self, what: str, attempt: Callable[[int], object], *, queue: bool = True) -> object:
        """A change of the source's triggers or map, tried until its lock is had: `attempt(wait_ms)`, 0 (only if
        free at once) until `queue_after` tries found the lock taken, then waiting for it, twice as long each time
        from `queue_first_ms` (as long as a firer holds a batch) up to the hold time. A table whose writers never
        leave it free at once has every write wait behind the request meanwhile, so the wait grows only as far as
        the longest transaction under way needs: a firer's claim that deletes holds its batch's transaction open
        until Kafka acknowledged it, its lookahead and more, at most the hold time. Without `queue`, a change that
        may be left undone (the drop of a move's triggers, which note nothing once the move is forgotten): never
        waited for, None once `queue_after` tries found the lock taken."""
        tries = 0
        while True:
            queued = tries - self.settings.queue_after
            wait_ms = 0 if queued < 0 else min(self.settings.queue_first_ms * 2 ** min(queued, 16), self.settings.hold_ms)
            result = attempt(wait_ms)
            if result is not None and result is not False:
                return result
            tries += 1
            if not queue and tries >= self.settings.queue_after:
                return None
            log.info("%s: the table is busy, trying again", what)
            self.sleep(self.settings.busy_retry_s)

    # -- the steps ---------------------------------------------------------------------------------

    def copy(self, moved: Moved, record: MoveRecord) -> None:
        """COPYING: the watch begun, then the rows due after the horizon copied ahead, dormant, from the cursor
        on, the changes carried over as they come."""
        source, target = self.stores[moved.source], self.stores[moved.target]
        self._until_done("the watch", lambda wait_ms: source.watch(moved.partition, wait_ms=wait_ms))
        cursor: int | None = record.cursor
        last_said = self.clock()
        pace = Pace(self.settings.rate)
        stretch = pace.chunk(self.settings.batch)
        while cursor is not None:
            rows, cursor = source.scan(moved.partition, cursor, record.horizon_us, stretch)
            moved.copied += target.put(rows, dormant=True)
            self.carry(moved)
            self._paced(pace, max(stretch, len(rows)))
            if cursor is not None:
                self._save(moved, COPYING, cursor)
            if self.clock() - last_said >= 5.0:
                last_said = self.clock()
                self.say(f"partition {moved.partition}: {moved.copied:,} rows copied ahead to cell {moved.target}")
        while self.carry(moved) >= self.settings.batch:
            pass  # caught up: what is left is carried at the cut-over
        self.say(f"partition {moved.partition}: {moved.copied:,} rows copied ahead, {moved.carried:,} changes "
                 f"carried over")

    def carry(self, moved: Moved) -> int:
        """One batch of the changes noted in the source carried over into the target (a row as it stands now
        copied dormant, one gone dropped there), then forgotten; how many."""
        source, target = self.stores[moved.source], self.stores[moved.target]
        changes = source.changes(moved.partition, self.settings.batch)
        if changes:
            target.put([c.row for c in changes if c.row is not None and c.row.cron is None], dormant=True)
            target.drop_copies([c.id for c in changes if c.row is None or c.row.cron is not None])
            source.forget(moved.partition, changes)
            moved.carried += len(changes)
        return len(changes)

    def cut_over(self, moved: Moved, record: MoveRecord) -> None:
        """CUTTING_OVER: the partition closed and frozen in the source; once no firer there holds a row of it,
        its last changes carried over, its rows due soon handed over live, its schedules shipped, its dormant
        rows due soon woken, and the partition opened in the target at the next epoch."""
        source, target, p = self.stores[moved.source], self.stores[moved.target], moved.partition
        started = self.clock()
        epoch = self._until_done("the freeze", lambda wait_ms: source.freeze(p))
        assert isinstance(epoch, int)
        settled_by = started + (self.settings.hold_ms + self.settings.detection_ms) / 1000.0
        while True:
            self.carry(moved)
            now_us = source.db_clock_us()
            # a row a firer's claim that deletes holds is due within that firer's lookahead (less than half the
            # hold time) of when it was taken: gone once its transaction commits, back (and handed over) if it
            # rolls back; PostgreSQL ends a silent firer's transaction after the hold time. Counted before the
            # hand-over, which passes held rows by: a row let go of between the two (handed back, or its take
            # rolled back) is still counted, and handed over next time (the freeze lets no firer take one anew)
            holding = source.held(p, now_us + max(self.settings.near_ms, self.settings.hold_ms) * 1000)
            handed = source.hand_over(p, max(record.horizon_us, now_us + self.settings.near_ms * 1000),
                                      self.settings.batch, lambda rows: target.put(rows, dormant=False))
            if handed:
                moved.handed += handed
                continue
            if handed == 0 and holding == 0:  # None: the rows' locks not had this time
                if not source.changes(p, 1):
                    break
                continue
            if self.clock() > settled_by:
                # the firer that holds them is taken for dead, as its cell's detector would after the hold time
                stale = source.find_stale(self.settings.hold_ms)
                if stale:
                    source.reset_stale(stale)
            self.renew(moved, CUTTING_OVER)
            self.sleep(self.settings.settle_poll_s)
        shipped = source.ship_schedules(p)
        target.put(shipped, dormant=False)
        source.shipped(p)
        moved.schedules = len(shipped)
        soon = target.db_clock_us() + self.settings.near_ms * 1000
        moved.woken += self._wake(target, p, soon, self.settings.batch)
        target.seq_at_least(source.seq_position())
        moved.epoch = epoch + 1
        target.open_partitions([p], moved.epoch)
        moved.cut_over_s = self.clock() - started
        self.say(f"partition {p}: cut over to cell {moved.target} at epoch {moved.epoch} in {moved.cut_over_s:.2f}s "
                 f"({moved.handed:,} rows handed over, {moved.schedules:,} schedules)")

    @staticmethod
    def _wake(target: CellStore, p: int, until_us: int | None, limit: int,
              each: Callable[[int], None] | None = None) -> int:
        """Wake the partition's dormant rows due up to `until_us`, `limit` at a time, each batch from where the
        last ended (a batch from the first would walk over every row woken before it); then from the first
        again until nothing is left, for a row a batch passed over. How many; `each` after every batch."""
        woken, after = 0, None
        while True:
            batch = target.wake(p, until_us, limit, after)
            if batch.count == 0:
                if after is None:
                    return woken
                after = None
                continue
            woken, after = woken + batch.count, batch.resume
            if each is not None:
                each(batch.count)

    def finish(self, moved: Moved, record: MoveRecord, target: CellStore) -> None:
        """FINISHING: the rest of the dormant rows woken, earliest first; the source's frozen rows of the
        partition deleted (those due soon first, again and again, so that none stands at the head of its due
        rows); the watch and freeze dropped where the table's lock is free at once, and the move forgotten."""
        source, p = self.stores[moved.source], moved.partition
        keep_clean = self.clock()
        cursor: int | None = record.cursor
        pace = Pace(self.settings.rate)
        chunk = pace.chunk(self.settings.batch)

        def clean() -> None:
            nonlocal keep_clean
            self.renew(moved, FINISHING, cursor or 0)
            if self.clock() - keep_clean >= 1.0:
                keep_clean = self.clock()
                until = source.db_clock_us() + self.settings.near_ms * 1000
                while source.drop_due(p, until, self.settings.batch) == self.settings.batch:
                    pass
        def woke(count: int) -> None:
            clean()
            self._paced(pace, count)
        moved.woken += self._wake(target, p, None, chunk, woke)
        while cursor is not None:
            cursor = source.drop_scan(p, cursor, chunk)
            if cursor is not None:
                self._save(moved, FINISHING, cursor)
            clean()
            self._paced(pace, chunk)
        if self._until_done("dropping the watch", lambda wait_ms: source.unwatch(p, wait_ms=wait_ms), queue=False) is None:
            self.say(f"partition {p}: its triggers stay on cell {moved.source}'s table, noting nothing (its writers "
                     f"never left the table's lock free at once)")
        source.end_move(p)
        self.say(f"partition {p} moved from cell {moved.source} to cell {moved.target}: {moved.woken:,} rows woken "
                 f"there")

    # -- a new cell ----------------------------------------------------------------------------------

    def add(self, cell: str, partitions: int | None, *, check: bool = True) -> list[Moved]:
        """Give `cell` its even share of the input partitions, moved one at a time from the cells that own the
        most; the moves recorded already are finished first. A map that lists nothing (one cell owns them all)
        is first written out, the topic's `partitions` to the first cell."""
        self._store(cell)
        done = [self.move(p, record.target, check=check) for p, (_, record) in sorted(self.records().items())]
        if not any(store.cell_partitions() for store in self.stores.values()):
            if partitions is None:
                raise MoveError("no cell lists the input partitions yet, and the input topic's partition count is "
                                "not known")
            first = next(iter(self.stores))
            self.stores[first].open_partitions(list(range(partitions)), 1)
            self.say(f"cell {first} lists the input partitions 0-{partitions - 1} it owned")
        cell_map = self.cell_map()
        owners = {c: cell_map.partitions_of(c) for c in cell_map.cells}
        plan = share_for(owners, cell)
        if plan:
            self.say(f"cell {cell} takes partitions {ranges(sorted(p for p, _ in plan))}")
        for partition, _ in plan:
            done.append(self.move(partition, cell, check=check))
        return done

