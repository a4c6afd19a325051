"""With cells: a poll's messages written to the cell of their input partition. The map is read from every
cell at start (an input topic of another partition count than the map's is refused); each poll is split by
cell and sorted on the loop's thread, and each cell's batch written by its own writer, on a thread of its
own, fenced by the map (`chronos.domain.cells`), the cells in parallel. A cell that refuses its write (its
list changed since the map was read) has the map read again and its messages written where the new map
says; a moving partition's messages wait for the map to say where it went. The poll is durable once every
cell's part is, and only then are its late messages published and its offsets committed."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from chronos.config import Settings
from chronos.domain.cells import CellMap, ranges
from chronos.domain.intake import Rules
from chronos.errors import CellMapChanged, KafkaUnanswered, StoreUnavailable
from chronos.ports import InputMessage as Message, IntakeStore
from chronos.roles.consumer.sorting import Batch, sort_batch
from chronos.roles.consumer.writer import Stored, Writer
from chronos.runtime.backoff import Backoff
from chronos.runtime.process import Lifecycle

log = logging.getLogger("chronos.consumer")

MAP_RETRY_CAP_S = 2.0  # the longest wait between two readings of the map while a partition is moving


def _partition(msg: Message) -> int:
    partition = msg.partition()
    assert partition is not None  # consumed, not an event
    return partition


@dataclass
class CellBatches:
    """A poll split by cell: each cell's messages and their batch, and the messages of moving partitions
    (written nowhere until the map says where they went)."""

    parts: dict[str, tuple[list[Message], Batch]] = field(default_factory=dict)
    held: list[Message] = field(default_factory=list)


class Cells:
    """The cells' map and a writer per cell, each on a thread of its own (its store is that thread's)."""

    def __init__(self, settings: Settings, life: Lifecycle, *, writers: dict[str, Writer], rules: Rules,
                 partitions: Callable[[], int | None]):
        """`writers`: a writer per cell, in the cells' order; `partitions()` the input topic's partition count
        (None when Kafka does not know the topic; KafkaUnanswered when it does not answer)."""
        self.settings, self.life, self.writers, self.rules = settings, life, writers, rules
        self.partitions = partitions
        self.map: CellMap | None = None
        self.threads = {cell: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"consumer-{cell}")
                        for cell in writers}

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

    def sort(self, messages: list[Message], now_us: int) -> CellBatches:
        """A poll split by the cell of each message's partition, each cell's part sorted (`sort_batch`)."""
        assert self.map is not None  # loaded at start
        by_cell, held = self.map.split(messages, _partition)
        return CellBatches({cell: (part, sort_batch(part, now_us, self.rules)) for cell, part in by_cell.items()},
                           held)

    def write(self, messages: list[Message], batches: CellBatches, epoch: int | None = None) -> bool:
        """Make a poll durable in its cells, then publish its late messages and dead letters: what
        `Writer.write` is for one store. False if stopped first; raises as it does."""
        done: list[tuple[Batch, Stored]] = []
        backoff = Backoff(first=0.1, cap=MAP_RETRY_CAP_S)
        while True:
            refused = self.store_parts(batches, epoch, done)
            if refused is None:
                return False
            again = [m for cell in refused for m in batches.parts[cell][0]] + batches.held
            if not again:
                break
            if refused:
                log.info("cells %s no longer own every partition this consumer wrote to them (the map changed): "
                         "reading the map again", ", ".join(refused))
            elif not self.life.sleep(backoff.failed()):  # nothing refused: a partition is moving, wait for it
                return False
            if not self.read_map():
                return False
            batches = self.sort(again, time.time_ns() // 1000)
        first = next(iter(self.writers.values()))
        return first.finish(messages, done)

    def store_parts(self, batches: CellBatches, epoch: int | None, done: list[tuple[Batch, Stored]]) -> list[str] | None:
        """Each cell's part written on its thread, all at once, with the map's fence; those stored added to
        `done`. The cells that refused the write (the map changed), or None if stopped first. An error of one
        cell's write (`OutOfReach`, `PartitionsLost`) is raised once every cell's has ended."""
        assert self.map is not None
        futures: dict[str, Future] = {}
        for cell, (part, batch) in batches.parts.items():
            fence = self.map.fence(cell, {_partition(m) for m in part})
            futures[cell] = self.threads[cell].submit(self.writers[cell].store_batch, batch, epoch, fence)
        refused: list[str] = []
        error: BaseException | None = None
        stopped = False
        for cell, future in futures.items():
            try:
                stored = future.result()
            except CellMapChanged:
                refused.append(cell)
                continue
            except Exception as exc:  # noqa: BLE001 - raised below, once every cell's write has ended
                error = error or exc
                continue
            if stored is None:
                stopped = True
            else:
                done.append((batches.parts[cell][1], stored))
        if error is not None:
            raise error
        return None if stopped else refused

    def keep_alive(self) -> None:
        """While idle, each cell asked the time now and then (`Writer.keep_alive`), on its thread."""
        for cell, writer in self.writers.items():
            self.threads[cell].submit(writer.keep_alive).result()

    def close(self) -> None:
        for thread in self.threads.values():
            thread.shutdown(wait=True)

    @property
    def stores(self) -> dict[str, IntakeStore]:
        return {cell: writer.store for cell, writer in self.writers.items()}
