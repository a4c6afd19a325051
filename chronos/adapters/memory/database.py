"""The in-memory database: its rows, parked messages, fire-rate buckets, the operators' action totals, its cell's
input partitions and its clock (`now_us`, injected so that tests control time; PostgreSQL uses its own clock), shared by any
number of store handles (`MemoryStore`). The clocks a test gives it: the machine's, or a manual one."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable

from chronos.domain.cells import CellPartition
from chronos.domain.model import Parked


def wall_clock_us() -> int:
    """Epoch microseconds now, by this machine's clock."""
    return time.time_ns() // 1000


class ManualClock:
    """A clock for tests: epoch microseconds that move only when `advance` is called."""

    def __init__(self, start_us: int | None = None):
        self.now_us = wall_clock_us() if start_us is None else start_us

    def __call__(self) -> int:
        return self.now_us

    def advance(self, seconds: float) -> None:
        self.now_us += round(seconds * 1_000_000)


@dataclass(slots=True, eq=False)
class Taken:
    """A firer's open transaction of the claim that deletes (`takes.MemoryTakes`): the rows it took stay in
    the table, held by it, until it commits (they go) or rolls back (they are back). Held, a row is in flight:
    every handle sees it, no claim takes it, a cancel or an operator's action leaves it alone. `ended`: rolled
    back without its firer knowing yet (PostgreSQL ended the session after the hold time)."""

    node: uuid.UUID
    since_us: int           # when the transaction began: the claim's time
    ended: bool = False


@dataclass(slots=True)
class StoredRow:
    """One row of chronos_messages, as the twin keeps it (times in epoch microseconds)."""

    id: str
    deadline_us: int
    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: bytes
    ordering_key: str | None
    cron: str | None
    timezone: str | None
    dst_policy: str | None
    seq: int
    ctid: str                       # changes with every write, as a row version's place does in PostgreSQL
    enqueued_us: int                # when it was written (or replaced)
    readied_us: int | None = None   # claimed at (readied_at)
    readied_by: uuid.UUID | None = None
    attempts: int = 0
    last_error: str | None = None
    original_deadline_us: int | None = None
    last_occurrence_us: int | None = None
    input_partition: int | None = None  # the input topic's partition it was read from (None: not known)
    frozen: bool = False            # its partition's move froze it here (`chronos.domain.moves`)
    held_by: Taken | None = None    # taken by a claim that deletes whose transaction is open

    @property
    def in_flight(self) -> bool:
        """Claimed: stamped as a firer's, or held by a firer's claim that deletes."""
        return self.readied_us is not None or self.held_by is not None

    @property
    def holder(self) -> tuple[uuid.UUID, int] | None:
        """(the firer, since when) of a row in flight; None for one that is not."""
        if self.held_by is not None:
            return self.held_by.node, self.held_by.since_us
        if self.readied_by is not None and self.readied_us is not None:
            return self.readied_by, self.readied_us
        return None

    @property
    def position(self) -> tuple[int, int]:
        """Where the row stands in its ordering key: the deadline as scheduled, then enqueue order."""
        return (self.deadline_us if self.original_deadline_us is None else self.original_deadline_us, self.seq)

    @property
    def waiting(self) -> bool:
        """Unclaimed (nor held), not a recurring schedule, not frozen by a move: what the claim and the counts
        of waiting rows see."""
        return self.readied_us is None and self.cron is None and self.held_by is None and not self.frozen


@dataclass(slots=True)
class MoveState:
    """A row of chronos_cell_moves: a move of a partition leaving this cell."""

    target: str
    step: str
    cursor: int
    horizon_us: int
    node: uuid.UUID
    seen_us: int


@dataclass(slots=True)
class StoredParked:
    """One row of chronos_parked: a parked message, its number (the table's id) and when it was parked."""

    number: int
    parked_us: int
    message: Parked


@dataclass(slots=True)
class Bucket:
    """A destination topic's fire-rate bucket, as a row of chronos_rate_limits."""

    rate: float
    tokens: float
    refilled_us: int


class MemoryDatabase:
    """The shared state behind any number of `MemoryStore` handles: one database."""

    def __init__(self, now_us: Callable[[], int] = wall_clock_us):
        self.now_us = now_us
        self.lock = threading.Lock()
        self.rows: dict[str, StoredRow] = {}
        self.parked: list[StoredParked] = []
        self.buckets: dict[str, Bucket] = {}     # by destination topic name, as chronos_rate_limits
        self.actions: dict[str, tuple[int, int]] = {}  # action -> (times taken, messages changed): chronos_actions
        self.firers: dict[uuid.UUID, int] = {}   # node -> its lease renewed at: chronos_firers
        self.processes: dict[uuid.UUID, tuple[str, str, int]] = {}  # node -> (role, /metrics URL, said at): chronos_processes
        self.cell_partitions: dict[int, CellPartition] = {}  # the input partitions this cell lists: chronos_cell_partitions
        self.moves: dict[int, MoveState] = {}     # moves of partitions leaving this cell: chronos_cell_moves
        # a moving partition's rows as the move last saw them (id -> ctid): what changed since is its changes
        self.watched: dict[int, dict[str, str]] = {}
        self.frozen: set[int] = set()             # partitions whose move froze their rows here
        self.outbox: dict[int, list[StoredRow]] = {}  # a moving partition's schedules: chronos_cell_move_outbox
        self.seq_last = 0                         # the last enqueue order given
        self.forwards: dict[str, tuple[str, int]] = {}  # id -> (action, noted): chronos_cell_forwards
        # (consumer group, node, cell) -> when the node last reached the cell, as it said here: chronos_consumer_reach
        self.reach: dict[tuple[str, uuid.UUID, str], int] = {}
        self._noted = itertools.count(1)
        self.unavailable: str | None = None       # set: every statement fails with StoreUnavailable(this)
        self._seq = itertools.count(1)
        self._ctid = itertools.count(1)
        self._parked = itertools.count(1)

    def next_seq(self) -> int:
        self.seq_last = next(self._seq)
        return self.seq_last

    def note_forwards(self, ids: Iterable[str], action: str) -> None:
        for mid in ids:
            self.forwards[mid] = (action, next(self._noted))

    def seq_at_least(self, seq: int) -> None:
        if self.seq_last < seq:
            self._seq = itertools.count(seq + 1)
            self.seq_last = seq

    def new_ctid(self) -> str:
        return f"(0,{next(self._ctid)})"

    def park(self, message: Parked, now_us: int) -> None:
        self.parked.append(StoredParked(next(self._parked), now_us, message))
