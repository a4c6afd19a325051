"""The in-memory store: a twin of the PostgreSQL store (`chronos.adapters.postgres.store.Store`)
with the same observable semantics (the roles' statements and the operators'), for unit tests of the
roles and of the operators' functions. Both pass one contract suite (tests/contract).

`MemoryDatabase` is the shared state of one database: its rows, parked messages, fire-rate buckets,
the operators' action totals and its clock (`now_us`, injected so that tests control time; PostgreSQL uses its own clock).
`MemoryStore` is a handle on it, one per thread as a PostgreSQL `Store` is one connection, made like the
PostgreSQL store of one class per port (`intake`, `claims`, `settle`, `detect`, `operators`). Every
call runs as one statement under the database's lock, so handles in several threads behave like
connections to one database; where PostgreSQL's concurrent claims skip rows another one has
locked, here one claim simply runs after the other. Setting `MemoryDatabase.unavailable` makes
every statement fail as a lost connection does (`StoreUnavailable`), until it is cleared. There is
no planner: the waiting count `overview` gives when it would estimate is the row count's.
"""

from chronos.adapters.memory.database import ManualClock, MemoryDatabase, wall_clock_us
from chronos.adapters.memory.store import MemoryStore
from chronos.adapters.memory.takes import MemoryTakes

__all__ = ["ManualClock", "MemoryDatabase", "MemoryStore", "MemoryTakes", "wall_clock_us"]
