"""The batches of the claim that deletes (CHRONOS_FIRER_CLAIM=delete): each claim's rows held in a
transaction of their own, on a session of its own (`ports.TakeStore`), from the claim until every row is
settled; then the transaction commits (the rows fired or dead-lettered are gone for good, those handed back
or put off for a retry are back, those to park are parked), or, when none of its rows went anywhere, rolls
back. `HeldBatches` keeps the sessions (at most one per batch in flight, MAX_HELD_BATCHES of them) and the
open batches: the claimers take a free session and hold their claim's rows on it, the settler ends them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from chronos.domain.model import Claimed
from chronos.ports import TakeStore


@dataclass(eq=False)
class Batch:
    """One claim's rows, held in `session`'s transaction until each is settled. The settler alone writes it
    once the claimer has handed it over (`HeldBatches.hold`)."""

    number: int
    session: TakeStore
    size: int
    fired: int = 0                                                       # acknowledged: gone with the commit
    dead: list[str] = field(default_factory=list)                        # dead-lettered (their reasons): gone too
    restore: list[Claimed] = field(default_factory=list)                 # handed back
    retry: list[tuple[Claimed, str, int]] = field(default_factory=list)  # (row, error, delay_ms)
    park: list[tuple[Claimed, str]] = field(default_factory=list)        # (row, reason)

    @property
    def done(self) -> bool:
        """Every row settled: the batch may end."""
        return self.fired + len(self.dead) + len(self.restore) + len(self.retry) + len(self.park) >= self.size

    @property
    def changes(self) -> bool:
        """Whether ending the batch changes the store (else it is rolled back: every row back as it was)."""
        return bool(self.fired or self.dead or self.retry or self.park)


class HeldBatches:
    """The firer's sessions for the claim that deletes and the batches open on them. A session is free, or
    holds one batch (from its claim until the settler ends it), or is claiming (between `session` and `hold` or
    `free`). Thread-safe: the claimers and the settler share it."""

    def __init__(self, sessions: Callable[[], TakeStore], limit: int):
        """`sessions` makes a session (one connection), at most `limit` of them, as they are needed."""
        self.make, self.limit = sessions, limit
        self.lock = threading.Lock()
        self.all: list[TakeStore] = []
        self.idle: list[TakeStore] = []
        self.open: dict[int, Batch] = {}
        self.numbers = 0

    def session(self) -> TakeStore | None:
        """A free session for a claim, made if none is free and fewer than `limit` are open; None when every
        one holds a batch or claims (the firer has as many batches in flight as it may)."""
        with self.lock:
            if self.idle:
                return self.idle.pop()
            if len(self.all) >= self.limit:
                return None
            made = self.make()
            self.all.append(made)
            return made

    def free(self, session: TakeStore) -> None:
        """A session that holds nothing (a claim that took nothing, a batch ended) is free again."""
        with self.lock:
            self.idle.append(session)

    def hold(self, session: TakeStore, rows: list[Claimed]) -> Batch:
        """The rows of a claim, held on `session`: a new batch, whose number each row now carries."""
        with self.lock:
            self.numbers += 1
            batch = Batch(self.numbers, session, len(rows))
            self.open[batch.number] = batch
        for row in rows:
            row.batch = batch.number
        return batch

    def get(self, number: int) -> Batch:
        with self.lock:
            return self.open[number]

    def ended(self, batch: Batch) -> None:
        """The batch is over (committed or rolled back): its session is free."""
        with self.lock:
            del self.open[batch.number]
            self.idle.append(batch.session)

    def drop_idle(self) -> None:
        """Close the free sessions' connections (each opens another when next used): after a claim found
        PostgreSQL gone, they are most likely broken too, and a claim on each in turn would fail in turn."""
        with self.lock:  # none of them is taken while it closes
            for session in self.idle:
                session.close()

    def in_flight(self) -> int:
        """Batches open now."""
        with self.lock:
            return len(self.open)

    def close(self) -> None:
        """Roll back what is still open and close every session (at the end of the firer)."""
        with self.lock:
            left, self.open = list(self.open.values()), {}
            sessions, self.all, self.idle = self.all, [], []
        for batch in left:
            batch.session.give_back()
        for session in sessions:
            session.close()
