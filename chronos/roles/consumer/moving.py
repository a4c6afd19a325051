"""With cells: the input partitions held back while they move (closed in their cell, opened in none yet),
followed on the consumer loop's thread. Each is paused and sought back to its first message not written; the
map is read from every cell every MAP_POLL_S, on their threads, until a cell opens it, then it is resumed and
read again from there."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from chronos.domain.cells import CellMap, ranges
from chronos.errors import StoreUnavailable
from chronos.ports import InputMessage as Message
from chronos.roles.consumer.writer import Writer

log = logging.getLogger("chronos.consumer")

MAP_POLL_S = 0.2  # how often the map is read while a partition is moving: its pause is the move's cut-over, no more
MOVING_WARN_S = 30.0  # a partition moving longer than this is said in the log, and again as long again later

TopicPartition = tuple[str, int]


def where(msg: Message) -> tuple[TopicPartition, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None  # consumed, not an event
    return (topic, partition), offset


def rewind(consumer: Any, rewound: dict[TopicPartition, int], messages: list[Message]) -> list[TopicPartition]:
    """Pause the partitions of these messages not paused yet and seek each back to its first one, unless it
    was sought back further already (`rewound`, updated; never forward: a message read before and not written
    comes first); returns the partitions paused now."""
    first: dict[TopicPartition, int] = {}
    for msg in messages:
        tp, offset = where(msg)
        first[tp] = min(offset, first.get(tp, offset))
    new = [tp for tp in first if tp not in rewound]
    if new:
        consumer.pause_partitions(new)
    back = {tp: offset for tp, offset in first.items() if offset < rewound.get(tp, offset + 1)}
    if back:
        consumer.seek_partitions(back)
        rewound.update(back)
    return new


class MovingPartitions:
    """The partitions held back while they move: each one's offset it was sought back to, since when, the
    reading of the map under way and when the next is due."""

    def __init__(self, writers: dict[str, Writer], threads: dict[str, ThreadPoolExecutor],
                 consumer: Callable[[], Any], clock: Callable[[], float]):
        """`consumer()`: the group's input consumer, which pauses, seeks and resumes."""
        self.writers, self.threads, self.consumer, self.clock = writers, threads, consumer, clock
        self.rewound: dict[TopicPartition, int] = {}
        self.forget()

    def forget(self) -> None:
        """Leaving the group: every partition held back resumed (the client keeps a pause through leaving the group
        and joining it again), and nothing held back any more (the partitions are the others' until it rejoins)."""
        if self.rewound:
            self.consumer().resume_partitions(list(self.rewound))
        self.rewound = {}
        self.since: dict[TopicPartition, float] = {}
        self.reads: dict[str, Future] | None = None
        self.next_read = 0.0

    def hold(self, messages: list[Message]) -> None:
        """After a poll was written: the partitions of its messages that are moving paused and sought back to
        their first one, until the map says a cell opened them."""
        new = rewind(self.consumer(), self.rewound, messages)
        now = self.clock()
        for tp in new:
            self.since[tp] = now
        if new:
            log.info("input partition(s) %s are moving to another cell: paused until it opens them",
                     ranges(sorted(p for _, p in new)))

    def look_after(self, any_down: bool) -> CellMap | None:
        """While partitions are moving, read the map from every cell now and then, on their threads (not while
        a cell does not answer); resume each partition a cell has opened since, to be read again from where it
        was sought back to. The map read, when one was."""
        now = self.clock()
        if not self.rewound:
            return None
        if self.reads is None:
            if now >= self.next_read and not any_down:
                self.reads = {cell: self.threads[cell].submit(writer.unless_failed, writer.store.cell_partitions)
                              for cell, writer in self.writers.items()}
            return None
        if not all(f.done() for f in self.reads.values()):
            return None
        reads, self.reads, self.next_read = self.reads, None, now + MAP_POLL_S
        try:
            cell_map = CellMap.build({cell: f.result() for cell, f in reads.items()})
        except StoreUnavailable as exc:  # a cell the writes will find down; read again next time
            log.debug("reading the map while partitions move: %s", exc)
            return None
        opened = [tp for tp in self.rewound if cell_map.owner(tp[1]).writable]
        if opened:
            # said before the resume, so that what reads the log once the partition flows finds the line
            for tp in opened:
                owner = cell_map.owner(tp[1])
                log.info("input partition %d is open in cell %s at epoch %d: read again after %.1fs paused", tp[1],
                         owner.cell, owner.epoch, now - self.since.pop(tp, now))
                del self.rewound[tp]
            self.consumer().resume_partitions(opened)
        for tp, since in self.since.items():
            if now - since >= MOVING_WARN_S:
                self.since[tp] = now
                log.warning("input partition %d has been moving for %.0fs and no cell this consumer knows opened it: "
                            "finish its move (chronos cells move), or, if it goes to a cell missing from this "
                            "consumer's CHRONOS_CELLS, restart the consumer with it", tp[1], MOVING_WARN_S)
        return cell_map
