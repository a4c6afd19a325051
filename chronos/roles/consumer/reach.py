"""With cells: which cells the consumers of the group reach, as each says in every cell it reaches. Every
REACH_EVERY_S the consumer says, in each cell that answers, how long ago it last reached each cell, and reads
there how long ago the other consumers of its group last said they reached each one: a statement on the cell's
own thread, so that it also reaches that cell, whichever partitions the consumer holds.

A consumer cut off from a cell reads, in the cells it still reaches, whether another consumer has reached that
cell since it lost it: then it asks the cell again, and if that fails too, it alone cannot reach the cell, and it
leaves its group so that the others take the cell's partitions. When none has (the cell is down, or cut off from
every consumer), it stays: leaving would hand the partitions to consumers that cannot write them either, and the
group would rebalance for nothing."""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Container

from chronos.errors import StoreRejected, StoreUnavailable
from chronos.roles.consumer.writer import Writer

log = logging.getLogger("chronos.consumer")

REACH_EVERY_S = 1.0  # how often the consumer says in each cell which cells it reaches: one statement a cell
# another consumer's reach counts only from this long after this one lost the cell: what each consumer says is
# measured on its own clock and the cell's, over a network, so a reach just before the cell went down for all
# never passes for one after
REACH_MARGIN_S = 1.0


class Reach:
    """What the consumer says and reads of the cells' reach, followed on the loop's thread: each cell's
    statement under way, when the next is due, and when (by `clock`) another consumer of the group last
    reached each cell, as far as the cells this one reaches say."""

    def __init__(self, writers: dict[str, Writer], threads: dict[str, ThreadPoolExecutor],
                 clock: Callable[[], float]):
        self.writers, self.threads, self.clock = writers, threads, clock
        self.under_way: dict[str, Future] = {}
        self.next_at: dict[str, float] = {}
        self.others: dict[str, float] = {}
        self.refused: set[str] = set()  # the cells that refused the statement (said once in the log)

    def note(self, down: Container[str]) -> None:
        """On the loop's thread: the answers of the statements that ended taken in, and each cell that
        answers and whose statement is due (not `down`, none under way) asked on its thread."""
        for cell, future in list(self.under_way.items()):
            if future.done():
                del self.under_way[cell]
                self.took(cell, future)
        now = self.clock()
        for cell in self.writers:
            if cell not in down and cell not in self.under_way and now >= self.next_at.get(cell, -math.inf):
                self.next_at[cell] = now + REACH_EVERY_S
                self.under_way[cell] = self.threads[cell].submit(self.say, cell)

    def say(self, cell: str) -> tuple[float, dict[str, int] | None, float]:
        """On `cell`'s thread: how long ago this consumer reached each cell (by its store's last answer; `cell`
        now, if the statement goes through), said in `cell`. The clock when it was asked, what the cell says of
        the others, and how long to wait before the next statement (the outage's backoff, when it failed)."""
        asked, at = self.clock(), time.monotonic()  # the stores' answers are times of time.monotonic
        ages = {c: 0 if c == cell else max(0, int((at - w.store.last_ok) * 1000))
                for c, w in self.writers.items() if c == cell or w.store.last_ok > 0}
        writer = self.writers[cell]
        if writer.last_failed:  # queued behind a statement that found the cell out of reach: its probe tries it
            return asked, None, REACH_EVERY_S
        try:
            return asked, writer.note_reach(ages), REACH_EVERY_S
        except StoreUnavailable as exc:
            return asked, None, max(REACH_EVERY_S, writer.db_outage.failed(exc))
        except StoreRejected as exc:  # the cell's writes go on; only this word is lost, said once
            if cell not in self.refused:
                self.refused.add(cell)
                log.warning("cell %s refuses this consumer's word of the cells it reaches (%s): a consumer cut off "
                            "from a cell leaves its group only once another has committed on its partitions", cell,
                            exc)
            return asked, None, REACH_EVERY_S

    def took(self, cell: str, future: Future) -> None:
        """A statement's answer: each cell's latest reach by another consumer, by this one's clock (the clock
        before it asked, less the age the cell gave: never later than it was)."""
        asked, others, wait = future.result()
        self.next_at[cell] = max(self.next_at.get(cell, -math.inf), asked + wait)
        for other, ms in (others or {}).items():
            self.others[other] = max(self.others.get(other, -math.inf), asked - ms / 1000.0)

    def others_reached(self, cell: str, since: float) -> float | None:
        """How long after `since` (by `clock`, when this consumer lost `cell`) another consumer of the group last
        reached `cell`, if it did at least REACH_MARGIN_S after; None if none did."""
        after = self.others.get(cell, -math.inf) - since
        return after if after >= REACH_MARGIN_S else None
