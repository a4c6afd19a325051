"""With cells: the cancels and replaces forwarded between cells. A cancel that finds no message in its
partition's cell, and a replace (whose earlier version may wait elsewhere), are noted in that cell in the
write's own transaction (a producer that does not route by the ordering key or the id can send them to another
partition than their message's); a round on a thread of its own forwards each cell's noted ones to every other
cell as a cancel of the id there, then forgets them: counted (`forwarded`), never dropped, kept while a cell
does not answer. The round waits on the cells' threads, never the poll on the round: a cell slow to answer
(hung, and not yet given up) holds up the forwarding only."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Container

from chronos.domain.cells import CANCEL
from chronos.errors import StoreUnavailable
from chronos.roles.consumer.writer import Writer

log = logging.getLogger("chronos.consumer")

FORWARD_EVERY_S = 1.0  # how often the cancels and replaces noted to forward are looked for, between those written
FORWARD_BATCH = 1000  # noted forwards a cell's round takes


class Forwarder:
    """The rounds of forwarding, one at a time, on a thread of their own."""

    def __init__(self, writers: dict[str, Writer], threads: dict[str, ThreadPoolExecutor], down: Container[str],
                 clock: Callable[[], float]):
        """`threads`: each cell's, which holds its writer's store; `down`: the cells that do not answer (skipped,
        their forwards kept); `clock` times the rounds."""
        self.writers, self.threads, self.down, self.clock = writers, threads, down, clock
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="consumer-forwards")
        self.under_way: Future | None = None
        self.next = 0.0  # when the noted forwards are looked for next (by `clock`)
        for writer in writers.values():
            writer.forward = True

    def due(self) -> bool:
        return self.clock() >= self.next

    def soon(self) -> None:
        """A round started, unless one is under way. Called by the thread that writes or, idle, the loop's, never
        both at once; raises what the last round raised (a cell's outage it keeps to itself)."""
        self.next = self.clock() + FORWARD_EVERY_S
        if self.under_way is not None:
            if not self.under_way.done():
                return
            self.under_way.result()
        self.under_way = self.thread.submit(self.round)

    def round(self) -> None:
        """Each cell's noted cancels and replaces, forwarded to every other cell as cancels of their ids, on the
        cells' threads; forgotten in their cell once every other cell has had them (a cell that does not answer
        keeps them noted, to forward again later: a cancel is the same done twice). Counted: the ones that
        reached their message in another cell (`forwarded`), and the cancels that found it nowhere."""
        stats = next(iter(self.writers.values())).stats
        for home, writer in self.writers.items():
            if home in self.down:
                continue
            try:
                pending = self.threads[home].submit(writer.unless_failed, writer.store.pending_forwards,
                                                   FORWARD_BATCH).result()
            except StoreUnavailable as exc:
                log.debug("cell %s: could not read its cancels to forward: %s", home, exc)
                continue
            if not pending:
                continue
            ids = [f.id for f in pending]
            found: dict[str, tuple[str, bool]] = {}
            everywhere = True
            for other, other_writer in self.writers.items():
                if other == home:
                    continue
                if other in self.down:
                    everywhere = False
                    continue
                try:
                    hits = self.threads[other].submit(other_writer.unless_failed,
                                                      other_writer.store.cancel_forwarded, ids).result()
                except StoreUnavailable as exc:
                    log.info("cell %s does not answer: the cancels forwarded from cell %s wait for it (%s)", other,
                             home, exc)
                    everywhere = False
                    continue
                found.update({mid: (other, in_flight) for mid, in_flight in hits.items()})
            cancels = {f.id for f in pending if f.action == CANCEL}
            stats["forwarded"] += len(found)  # a replace's earlier version gone from another cell is no cancel
            stats["cancelled"] += sum(not in_flight for mid, (_, in_flight) in found.items() if mid in cancels)
            stats["cancelled_in_flight"] += sum(in_flight for mid, (_, in_flight) in found.items() if mid in cancels)
            if found:
                log.info("forwarded %d cancels and replaces from cell %s: %d reached their message in another cell "
                         "(%s)", len(pending), home, len(found),
                         ", ".join(f"{mid!r} in cell {cell}" for mid, (cell, _) in list(found.items())[:5]))
            if everywhere:
                stats["cancel_unknown"] += len(cancels - found.keys())
                try:
                    self.threads[home].submit(writer.unless_failed, writer.store.forget_forwards, pending).result()
                except StoreUnavailable as exc:  # noted still: forwarded again, which changes nothing
                    log.debug("cell %s: could not forget its forwarded cancels: %s", home, exc)

    def close(self) -> None:
        """Wait for the round under way (before the cells' threads it waits on end)."""
        self.thread.shutdown(wait=True)
