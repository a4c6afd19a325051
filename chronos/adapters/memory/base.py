"""What every handle on the in-memory database is (`ports.StoreHandle`): its database, its node, and every
call run as one statement under the database's lock, at one time of its clock."""

from __future__ import annotations

import time
import uuid
from typing import Callable, TypeVar

from chronos import ports
from chronos.adapters.memory.database import MemoryDatabase
from chronos.errors import StoreUnavailable

T = TypeVar("T")


class MemoryHandle:
    """A handle on a `MemoryDatabase` (a fresh one when none is given), for one thread; the statements of
    each port are in a class of their own over this one."""

    def __init__(self, db: MemoryDatabase | None = None, *, node_id: uuid.UUID | None = None):
        self.db = db if db is not None else MemoryDatabase()
        self.node_id = node_id
        self.last_ok = 0.0
        self.last_unanswered = 0.0
        self.link = ports.Link()

    def close(self) -> None:
        """Nothing to close: the database outlives its handles."""

    def announce(self, role: str, scheme: str, port: int, address: str | None) -> str:
        """`ports.Presence.announce`; with no address, 127.0.0.1 (the twin has no connection)."""
        host = address or "127.0.0.1"
        url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/metrics"
        assert self.node_id is not None, "a process's store has its node"
        node = self.node_id

        def run(now: int) -> str:
            self.db.processes = {n: p for n, p in self.db.processes.items() if now - p[2] < 86_400_000_000}
            self.db.processes[node] = (role, url, now)
            return url
        return self._run(run)

    def withdraw(self) -> None:
        """`ports.Presence.withdraw`."""
        self._run(lambda now: self.db.processes.pop(self.node_id, None))  # type: ignore[arg-type]

    def cancel(self) -> None:
        """Nothing to cancel: a statement here never waits on I/O."""

    def _run(self, fn: Callable[[int], T]) -> T:
        """Run fn(now_us) as one statement: under the database's lock, at one time of its clock."""
        with self.db.lock:
            if self.db.unavailable is not None:
                self.last_unanswered = time.monotonic()
                raise StoreUnavailable(self.db.unavailable)
            result = fn(self.db.now_us())
        self.last_ok = time.monotonic()
        return result

    def db_clock_us(self) -> int:
        """The database's clock, in epoch microseconds: a statement of every port's."""
        return self._run(lambda now: now)
