"""Moves of input partitions between cells: the rows a move carries, where it stands, and how the rows it
copies ahead wait in the cell they go to. Pure.

A move of a partition from its cell (the source) to another (the target) goes in three steps, recorded in the
source's database (`chronos_cell_moves`) so that it is finished by whoever runs it again:

- `COPYING`: the source notes every row of the partition written from now on (its watch), and the rows due
  after the move's horizon are copied ahead into the target, dormant (below); the noted changes are carried
  over as they come.
- `CUTTING_OVER`: the partition is closed in the source (its consumers' writes are refused from now on) and
  frozen there (no firer claims a row of it, no operator changes one); once no row of it is held in flight, the
  last changes are carried over, the rows due soon and its recurring schedules handed over live, the dormant
  rows due soon woken, and the target opens the partition at the next epoch.
- `FINISHING`: the target wakes the rest of the rows copied ahead, in deadline order; the source deletes its
  frozen rows of the partition and drops its watch and freeze.

A dormant row is held in flight by `MOVE_NODE`, claimed at a time in the far future that follows its deadline
(`dormant_mark_us`): no firer claims it and no detector hands it back, operators' actions leave it alone, and
the target's rows of its ordering key still wait behind it; a cancel or a replace from a consumer reaches it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from chronos.errors import ConfigError

COPYING, CUTTING_OVER, FINISHING = "copying", "cutting-over", "finishing"
STEPS = (COPYING, CUTTING_OVER, FINISHING)

#: Who holds the rows a move copied ahead into a cell, until it wakes them ("move" in its first bytes).
MOVE_NODE = uuid.UUID("6d6f7665-0000-4000-8000-000000000000")

#: A dormant row is claimed at a time from 9000-01-01 on (epoch microseconds), never reached by any clock: that
#: time follows its deadline, at a tenth of its pace, so that the rows due up to a time are one range of the
#: index of claimed rows, and it stays within the year 9999 that client libraries read.
DORMANT_FROM_US = 221_845_392_000_000_000
_FIRST_DEADLINE_US = -62_135_596_800_000_000  # 0001-01-01, the earliest deadline a message may have


class MoveError(ConfigError):
    """A move that cannot be made as asked: an unknown cell or partition, a partition already where it is asked
    to go, one on its way to another cell, a target not ready for it (exit code 2)."""


class MoveBusy(MoveError):
    """Another `chronos cells move` runs this move now (its lease is alive)."""


def dormant_mark_us(deadline_us: int) -> int:
    """When a dormant row of this deadline is held as claimed (`readied_at`, epoch microseconds)."""
    return DORMANT_FROM_US + (deadline_us - _FIRST_DEADLINE_US) // 10


@dataclass(slots=True)
class MovingRow:
    """A row as a move carries it from cell to cell: every column that makes the message (times in epoch
    microseconds). Who holds it in flight stays behind."""

    id: str
    deadline_us: int
    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: bytes | None
    ordering_key: str | None
    input_partition: int | None
    cron: str | None
    timezone: str | None
    dst_policy: str | None
    seq: int
    enqueued_us: int
    attempts: int = 0
    last_error: str | None = None
    original_deadline_us: int | None = None
    last_occurrence_us: int | None = None


@dataclass(slots=True)
class Change:
    """A row of a moving partition written since the move began: its id, the number of its last change, and
    the row as it stands now (None: gone from the partition, deleted or replaced into another)."""

    id: str
    n: int
    row: MovingRow | None


@dataclass(slots=True)
class MoveRecord:
    """A move as its source cell records it: the partition, the cell it goes to, its step, how far its copy has
    read (`cursor`, the store's own measure), the horizon after which rows are copied ahead, and its lease
    (who runs it, and how long ago they last said so)."""

    partition: int
    target: str
    step: str
    cursor: int
    horizon_us: int
    node: uuid.UUID
    lease_age_ms: int


@dataclass(frozen=True, slots=True)
class Woken:
    """What one batch of a move's wake did: how many rows it woke, and where the next batch starts (the last
    one's dormant mark; None when there was none)."""
    count: int
    resume: int | None


@dataclass
class Pace:
    """How fast a move's rows go: `rate` rows a second on average (0: as fast as the databases go), so that the
    copy, the waking and the deletion of a large partition leave the cells' cores to their firers and consumers.
    A step that fell behind (its statements slower than the rate) makes up at most `catch_up_s` of it at once.
    Time is given (`now`, seconds of any steady clock)."""

    rate: float
    catch_up_s: float = 1.0
    _paid: float | None = None  # when the rows done so far are due at the rate

    def after(self, rows: int, now: float) -> float:
        """`rows` more done at `now`: how long to wait before the next ones (seconds)."""
        if self.rate <= 0:
            return 0.0
        start = now if self._paid is None else max(self._paid, now - self.catch_up_s)
        self._paid = start + rows / self.rate
        return max(0.0, self._paid - now)

    def chunk(self, limit: int, per_s: int = 10) -> int:
        """Rows per statement: about `per_s` statements a second at the rate, at most `limit`, so that no single
        statement keeps a core long; at least a hundred, for the round trips' sake."""
        if self.rate <= 0:
            return limit
        return max(min(100, limit), min(limit, int(self.rate / per_s)))


def share_for(owners: dict[str, list[int]], cell: str) -> list[tuple[int, str]]:
    """The partitions to move to `cell` (listed in `owners`, the partitions of each cell, maybe none) so that it
    owns its even share: (partition, the cell it leaves), taken one at a time from the cell that owns the most
    (the highest partition of it first; of cells that own as many, the last), until no cell owns more than one
    partition over the new one's count."""
    counts = {c: sorted(ps) for c, ps in owners.items()}
    counts.setdefault(cell, [])
    total = sum(len(ps) for ps in counts.values())
    wanted = total // len(counts)
    plan: list[tuple[int, str]] = []
    while len(counts[cell]) < wanted:
        donor = max((c for c in counts if c != cell), key=lambda c: (len(counts[c]), list(counts).index(c)))
        partition = counts[donor].pop()
        counts[cell].append(partition)
        plan.append((partition, donor))
    return plan
