"""With cells: a poll's messages written to the cell of their input partition. The map is read from every
cell at start (an input topic of another partition count than the map's is refused); each poll is split by
cell and sorted on the loop's thread, and each cell's batch written by its own writer, on a thread of its
own, fenced by the map (`chronos.domain.cells`), the cells in parallel. A cell that refuses its write (its
list changed since the map was read) has the map read again and its messages written where the new map
says. A moving partition's messages are held back while the others flow on (chronos.roles.consumer.moving).
A poll's part is durable once its cell's is: then its late messages are published and its offsets committed,
partition by partition. The cancels and replaces a write notes to forward to the other cells go there on a
thread of their own (chronos.roles.consumer.forwards). A message parked (no topic took it) is kept in its
partition's cell.

A cell that does not answer (down, hung, cut off from this host) is given up at once: its part of the poll is not
committed, its partitions are paused and sought back to the first message not written, while the other cells'
partitions flow on. A hung cell does not hold up the poll for the statement's deadline
(CHRONOS_DATABASE_TIMEOUT_MS): once the other cells' parts are durable, a part that has not answered within
CELL_PATIENCE_S more is given up as well, its write left to end on its cell's thread (a write that ends well
after all is written again, idempotently, when its messages are read again). Its database is asked the time until
it answers, then its partitions are resumed and read again from there. The consumer leaves its group for such a
cell only once the hold time has passed and another consumer of the group has reached the cell since, as it says
in the cells this one reaches (chronos.roles.consumer.reach), and it has not reached the cell since (a try begun
after that failed, or none answered for the hold time: it asks at once, for a failover that ended brings the cell
back for all), or has committed on one of the cell's partitions: it alone cannot reach a cell that the others
reach. A cell down for every consumer has its partitions paused in each, and no one leaves. Leaving, it resumes
every partition it paused: the client keeps a pause through leaving the group and joining it again."""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

from chronos.config import Settings
from chronos.domain.cells import CellMap, ranges
from chronos.domain.model import Parked
from chronos.domain.intake import Rules
from chronos.errors import CellMapChanged, KafkaUnanswered, StoreUnavailable
from chronos.ports import InputMessage as Message
from chronos.roles.consumer.forwards import Forwarder
from chronos.roles.consumer.group import POSTGRES, Group, OutOfReach
from chronos.roles.consumer.moving import MovingPartitions, TopicPartition, rewind
from chronos.roles.consumer.reach import Reach
from chronos.roles.consumer.sorting import CANCEL, REPLACE, Batch, sort_batch
from chronos.roles.consumer.writer import Stored, Unreached, Writer
from chronos.runtime.backoff import Backoff
from chronos.runtime.process import Lifecycle

log = logging.getLogger("chronos.consumer")

# how much longer than the other cells' parts of a poll a cell's part may take before it is given up (never more
# than CHRONOS_DATABASE_TIMEOUT_MS): short enough that the messages of the cells that answer, read in the
# meantime, are stored before they are due (the shortest delay worth scheduling is longer), long enough that a
# healthy cell's slower write is rarely taken for a hung one (that costs only its part read again)
CELL_PATIENCE_S = 0.5


def _partition(msg: Message) -> int:
    partition = msg.partition()
    assert partition is not None  # consumed, not an event
    return partition


def _abandoned(cell: str) -> Callable[[Future], None]:
    """What becomes of a write given up while under way: logged when it failed otherwise than by not answering
    (its messages are read and written again either way)."""
    def ended(future: Future) -> None:
        exc = future.exception()
        if exc is not None and not isinstance(exc, (Unreached, StoreUnavailable, CellMapChanged)):
            log.warning("the write to cell %s given up while under way failed: %s", cell, exc)
    return ended


def _probe(writer: Writer, clock: Callable[[], float]) -> tuple[float, StoreUnavailable] | None:
    """On the cell's thread: its database asked the time; None if it answered, else when (by `clock`) the try
    began, and how it failed."""
    began = clock()
    try:
        writer.store.db_clock_us()
    except StoreUnavailable as exc:
        return began, exc
    return None


def _stragglers(futures: dict[str, Future], patience: float) -> list[str]:
    """Wait for the cells' writes of a poll: all of them, or, once one has ended, the others for `patience`
    more after the last that ended; the cells whose write is still under way then (a hung cell's). When
    none ends (every cell slow, or this host cut off from all), each is waited for until its statements'
    deadline, as one database is without cells."""
    pending = set(futures.values())
    if len(pending) < 2:
        return []
    done, pending = wait(pending, return_when=FIRST_COMPLETED)
    while pending:
        done, pending = wait(pending, timeout=patience, return_when=FIRST_COMPLETED)
        if not done:
            return [cell for cell, future in futures.items() if future in pending]
    return []


@dataclass
class CellBatches:
    """A poll split by cell: each cell's messages and their batch, and the messages of moving partitions
    (written nowhere until the map says where they went)."""

    parts: dict[str, tuple[list[Message], Batch]] = field(default_factory=dict)
    held: list[Message] = field(default_factory=list)


@dataclass
class Written:
    """What became of a poll: the messages now durable (in the cells that took their part, or published),
    to commit; each cell that did not answer, with its part's messages, to read again; and the messages of
    partitions that are moving, to read again once a cell opens them."""

    durable: list[Message]
    down: dict[str, list[Message]] = field(default_factory=dict)
    moving: list[Message] = field(default_factory=list)


@dataclass
class Down:
    """A cell that does not answer, as the loop's thread follows it: since when (by the process's clock), the
    partitions paused for it and the offset each was sought back to, the group's progress when it went down,
    the probe of its database, when this consumer's last try of it that failed began, and when another consumer
    first reached it since."""

    since: float
    others_before: dict[int, int] | None
    rewound: dict[TopicPartition, int] = field(default_factory=dict)
    probe: Future | None = None
    next_probe: float = 0.0
    checked: bool = False  # whether the others' progress was looked at once the hold time passed
    tried_at: float = -math.inf  # by the clock: when the last probe that failed began (none yet: -inf)
    others_at: float | None = None  # by the clock: when another consumer first reached it after this one lost it


class Cells:
    """The cells' map and a writer per cell, each on a thread of its own (its store is that thread's)."""

    def __init__(self, settings: Settings, life: Lifecycle, *, writers: dict[str, Writer], rules: Rules,
                 group: Group, partitions: Callable[[], int | None], clock: Callable[[], float]):
        """`writers`: a writer per cell, in the cells' order; `partitions()` the input topic's partition count
        (None when Kafka does not know the topic; KafkaUnanswered when it does not answer); `clock` times the
        cells that do not answer against the hold time."""
        self.settings, self.life, self.writers, self.rules = settings, life, writers, rules
        self.group, self.partitions, self.clock = group, partitions, clock
        self.map: CellMap | None = None
        self.threads = {cell: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"consumer-{cell}")
                        for cell in writers}
        self.down: dict[str, Down] = {}  # the loop thread's: the cells that do not answer
        # the loop thread's: the partitions held back while they move
        self.moving = MovingPartitions(writers, self.threads, lambda: group.consumer, clock)
        self.forwards = Forwarder(writers, self.threads, self.down, clock)
        self.patience = min(CELL_PATIENCE_S, settings.database_timeout_ms / 1000.0)
        self.pinging: dict[str, Future] = {}  # the loop thread's: each cell's idle probe under way
        self.reach = Reach(writers, self.threads, clock)  # the loop thread's: which cells the group reaches

    def load(self) -> bool:
        """Read the map at start and hold the input topic to it (CellMapError, or CellsUnsupported, to stop
        the process on: waiting would not change them); False if stopped first."""
        if not self.read_map():
            return False
        assert self.map is not None
        backoff = Backoff(first=0.5, cap=5.0)
        while self.life.running:
            try:
                count = self.partitions()
                break
            except KafkaUnanswered as exc:
                delay = backoff.failed()
                log.warning("kafka does not say how many partitions %s has (%s); asking again in %.1fs",
                            self.settings.input_topic, exc, delay)
                self.life.sleep(delay)
        else:
            return False
        # a topic not there yet: a message of a partition the map does not know stops the process (CellMapError)
        if count is not None:
            self.map.check_topic(self.settings.input_topic, count)
        owned = {cell: ranges(self.map.partitions_of(cell)) if self.map.owners else "all" for cell in self.map.cells}
        log.info("cells: %s", ", ".join(f"{cell} (partitions {partitions})" for cell, partitions in owned.items()))
        return True

    def read_map(self) -> bool:
        """The map, read again from every cell (on their threads), each cell's outage waited out; False if
        stopped first."""
        lists = {}
        for cell, writer in self.writers.items():
            while True:
                try:
                    lists[cell] = self.threads[cell].submit(writer.store.cell_partitions).result()
                    writer.db_outage.ok()
                    break
                except StoreUnavailable as exc:
                    if not self.life.sleep(writer.db_outage.failed(exc)):
                        return False
        self.map = CellMap.build(lists)
        return True

    def is_down(self, cell: str) -> bool:
        """Whether `cell` does not answer and its partitions are paused (read by the metrics' thread)."""
        return cell in self.down

    def sort(self, messages: list[Message], now_us: int) -> CellBatches:
        """A poll split by the cell of each message's partition, each cell's part sorted (`sort_batch`); the
        messages of a cell that does not answer are held back (loop thread)."""
        assert self.map is not None  # loaded at start
        by_cell, held = self.map.split(messages, _partition)
        for cell in [c for c in by_cell if c in self.down]:
            self.hold_back(cell, by_cell.pop(cell))
        return CellBatches({cell: (part, sort_batch(part, now_us, self.rules)) for cell, part in by_cell.items()},
                           held)

    def write(self, messages: list[Message], batches: CellBatches, epoch: int | None = None) -> Written | None:
        """Make a poll durable in its cells, then publish the late messages and dead letters of the parts
        stored: what `Writer.write` is for one store, but for the parts of the cells that do not answer,
        given up (`Written.down`), and the messages of moving partitions, held back (`Written.moving`). None if
        stopped first; raises as `Writer.write` does."""
        done: list[tuple[Batch, Stored]] = []
        written = Written([])
        while True:
            refused = self.store_parts(batches, epoch, done, written)
            if refused is None:
                return None
            written.moving += batches.held
            again = [m for cell in refused for m in batches.parts[cell][0]]
            if not again:
                break
            log.info("cells %s no longer own every partition this consumer wrote to them (the map changed): "
                     "reading the map again", ", ".join(refused))
            if not self.read_map():
                return None
            assert self.map is not None
            by_cell, held = self.map.split(again, _partition)
            batches = CellBatches({cell: (part, sort_batch(part, time.time_ns() // 1000, self.rules))
                                   for cell, part in by_cell.items()}, held)
        if any(batch.of(CANCEL) or batch.of(REPLACE) for batch, _ in done) or self.forwards.due():
            self.forwards.soon()
        first = next(iter(self.writers.values()))
        return written if first.finish(written.durable, done) else None

    def store_parts(self, batches: CellBatches, epoch: int | None, done: list[tuple[Batch, Stored]],
                    written: Written) -> list[str] | None:
        """Each cell's part written on its thread, all at once, with the map's fence: those stored added to
        `done` and `written.durable`, those of cells that did not answer to `written.down`. The cells that
        refused the write (the map changed), or None if stopped first. An error of one cell's write
        (`OutOfReach`, `PartitionsLost`) is raised once every cell's has ended."""
        assert self.map is not None
        futures: dict[str, Future] = {}
        refused: list[str] = []
        for cell, (part, batch) in batches.parts.items():
            try:
                fence = self.map.fence(cell, {_partition(m) for m in part})
            except CellMapChanged:  # sorted on the map before the one the last poll's write read again
                refused.append(cell)
                continue
            futures[cell] = self.threads[cell].submit(self.writers[cell].store_batch, batch, epoch, fence,
                                                      give_up=True)
        error: BaseException | None = None
        stopped = False
        for cell in _stragglers(futures, self.patience):
            log.info("cell %s has not answered within %.1fs of the other cells: its part of the poll is given up, "
                     "its write left to end on its own", cell, self.patience)
            futures.pop(cell).add_done_callback(_abandoned(cell))
            written.down.setdefault(cell, []).extend(batches.parts[cell][0])
        for cell, future in futures.items():
            part, batch = batches.parts[cell]
            try:
                stored = future.result()
            except CellMapChanged:
                refused.append(cell)
                continue
            except Unreached:
                written.down.setdefault(cell, []).extend(part)
                continue
            except Exception as exc:  # noqa: BLE001 - raised below, once every cell's write has ended
                error = error or exc
                continue
            if stored is None:
                stopped = True
            else:
                done.append((batch, stored))
                written.durable += part
        if error is not None:
            raise error
        return None if stopped else refused

    def park(self, parked: list[tuple[int | None, Parked]]) -> list[tuple[int | None, Parked]]:
        """`LatePath.keep_parked` with cells: each parked message kept in the cell of the partition it was read
        from (the first cell's when not known), each cell's on its thread; those of a cell that did not answer
        returned, to park again."""
        by_cell: dict[str, list[tuple[int | None, Parked]]] = {}
        first = next(iter(self.writers))
        for partition, p in parked:
            by_cell.setdefault(first if self.map is None else self.map.cell_of(partition, first), []).append((partition, p))
        futures = {cell: self.threads[cell].submit(self.writers[cell].unless_failed, self.writers[cell].store.park,
                                                 [p for _, p in items])
                   for cell, items in by_cell.items()}
        left: list[tuple[int | None, Parked]] = []
        failure: StoreUnavailable | None = None
        for cell, future in futures.items():
            try:
                future.result()
            except StoreUnavailable as exc:
                left += by_cell[cell]
                failure = exc
        if failure is not None and len(left) == len(parked):
            raise failure
        return left

    # -- the cells that do not answer, followed on the loop's thread ---------------------------------

    def went_down(self, written: Written, pending: CellBatches | None) -> None:
        """After a poll was written: each cell that did not answer is followed from now on, its messages of
        the poll and of the next one, read meanwhile (`pending`), held back."""
        for cell, part in written.down.items():
            self.follow(cell)
            self.hold_back(cell, part)
            if pending is not None and cell in pending.parts:
                self.hold_back(cell, pending.parts.pop(cell)[0])

    def follow(self, cell: str) -> None:
        """A cell that does not answer followed from now on (its messages read from now on held back), unless it
        is already."""
        if cell not in self.down:
            log.warning("cell %s does not answer: its partitions are paused, and read again once it answers; the "
                        "other cells' go on", cell)
            self.down[cell] = Down(self.clock(), self.group.progress())

    def hold_back(self, cell: str, messages: list[Message]) -> None:
        """Pause the partitions of these messages of a cell that does not answer, and seek each back to its first
        one (never forward: a message read before and not written comes first)."""
        rewind(self.group.consumer, self.down[cell].rewound, messages)

    def look_after_moving(self) -> None:
        """The partitions that move followed (`MovingPartitions.look_after`), the map they read kept."""
        self.map = self.moving.look_after(bool(self.down)) or self.map

    def look_after(self) -> None:
        """Ask each cell that does not answer the time, now and then, on its thread; resume its partitions once
        it answers. Raises `OutOfReach` once one has not answered for the hold time while another consumer of
        the group reached it since it went down (`leave_if_others_reach`). A cell whose last statement (a word of
        reach, an idle probe) found it out of reach is followed so too: its probe is then the only statement that
        tries it (`Writer.unless_failed`)."""
        now = self.clock()
        for cell, writer in self.writers.items():
            if writer.last_failed:
                self.follow(cell)
        for cell, down in list(self.down.items()):
            writer = self.writers[cell]
            if down.probe is not None and down.probe.done():
                failed = down.probe.result()
                down.probe = None
                if failed is None:
                    writer.db_outage.ok()
                    log.warning("cell %s answers again after %.1fs: its partitions are read again", cell,
                                now - down.since)
                    self.group.consumer.resume_partitions(list(down.rewound))
                    del self.down[cell]
                    continue
                down.tried_at, exc = failed
                down.next_probe = now + writer.db_outage.failed(exc)
            if down.probe is None and now >= down.next_probe:
                down.probe = self.threads[cell].submit(_probe, writer, self.clock)
            if down.others_at is None:  # looked at every time: the first reach by another after this one lost it
                after = self.reach.others_reached(cell, down.since)
                down.others_at = None if after is None else down.since + after
            if now - down.since >= self.settings.hold_time_ms / 1000.0:
                self.leave_if_others_reach(cell, down, now)

    def leave_if_others_reach(self, cell: str, down: Down, now: float) -> None:
        """`OutOfReach` if another consumer of the group reached `cell` since this one lost it, as it said in a cell
        this one reaches (`Reach`), and this one has not since: a try of its own begun after that failed, or none
        answered for the hold time after it (a try that hangs, on a network that drops this host's packets); or
        if, looked at once, another committed on one of the cell's partitions."""
        if down.others_at is not None:
            if down.tried_at >= down.others_at or now - down.others_at >= self.settings.hold_time_ms / 1000.0:
                log.warning("another consumer of group %s reached cell %s %.1fs after this one lost it, and this one "
                            "has not reached it since: this one alone cannot reach it", self.settings.consumer_group,
                            cell, down.others_at - down.since)
                raise OutOfReach(f"{POSTGRES} of cell {cell}", now - down.since, 1.0)
            # the cell may be back for every consumer (a failover that ended): asked again at once, rather than
            # leave the group for a cell this one reaches too
            if down.probe is None:
                down.next_probe = now
            return
        if not down.checked:
            down.checked = True
            mine = self.map.partitions_of(cell) if self.map is not None and self.map.owners else None
            if self.group.others_serve(down.others_before, mine):
                log.warning("another consumer of group %s committed on the partitions of cell %s since this one "
                            "lost it: this one alone cannot reach it", self.settings.consumer_group, cell)
                raise OutOfReach(f"{POSTGRES} of cell {cell}", now - down.since, 1.0)
            log.warning("cell %s has not answered for the hold time, and no other consumer of group %s has reached "
                        "it since: staying in the group, its partitions paused (no other consumer could write them); "
                        "leaving it once another does", cell, self.settings.consumer_group)

    def forget_down(self) -> None:
        """Leaving the group: every partition paused for a cell that does not answer, or for a move
        (`MovingPartitions.forget`), resumed, and nothing followed any more (the partitions are the others' until
        it rejoins, then read from their last commit). The client keeps a partition's pause through leaving the
        group and joining it again: one paused here and assigned back on rejoining would never be read again, by
        this consumer or any other."""
        paused = [tp for down in self.down.values() for tp in down.rewound]
        if paused:
            self.group.consumer.resume_partitions(paused)
        self.down.clear()
        self.moving.forget()

    def keep_alive(self) -> None:
        """While idle, each cell that answers asked the time now and then (`Writer.keep_alive`), on its thread,
        without waiting for one that takes long (a hung cell's probe ends at its statement's deadline; the next
        write to the cell finds it out); and what is noted to forward, forwarded now and then."""
        for cell, writer in self.writers.items():
            under_way = self.pinging.get(cell)
            if cell not in self.down and (under_way is None or under_way.done()):
                self.pinging[cell] = self.threads[cell].submit(writer.unless_failed, writer.keep_alive)
        for cell, future in list(self.pinging.items()):
            if future.done():
                del self.pinging[cell]
                if not isinstance(future.exception(), StoreUnavailable):  # not tried: the next look follows the cell
                    future.result()  # raises what the probe raised: a failure is its own to wait out, not the loop's
        if self.forwards.due():
            self.forwards.soon()

    def close(self) -> None:
        self.forwards.close()  # first: its round waits on the cells' threads
        for thread in self.threads.values():
            thread.shutdown(wait=True)
