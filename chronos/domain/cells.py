"""Cells: which database holds each input partition's messages. Pure.

A cell is one PostgreSQL with its firers and detectors. Each cell's database lists the input partitions
it owns (`chronos_cell_partitions`), each with an epoch and a state: `open` (its messages are written
there) or `moving` (on its way to another cell, written nowhere meanwhile). The map is what every cell
says, put together (`CellMap.build`): a partition listed by two cells (the old and the new one of a move)
is the one's with the higher epoch. A map in which no cell lists any partition is a deployment of one
cell, which owns every partition, whatever the topic's count.

A write to a cell carries a `Fence`: the epochs at which the writer believes the cell owns the partitions
written. The store checks it in the write's own transaction and refuses the write when the cell's list says
otherwise, so a writer holding a stale map never writes a moved partition: it reads the map again and
writes again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

from chronos.errors import CellMapChanged, ConfigError

OPEN, MOVING = "open", "moving"
STATES = (OPEN, MOVING)

T = TypeVar("T")


class CellMapError(ConfigError):
    """The cells' lists do not make one map (a partition owned by none or by two at one epoch, no partition
    assigned among several cells), or the input topic's partition count is not the map's."""


@dataclass(frozen=True, slots=True)
class CellPartition:
    """One row of a cell's list: an input partition it owns, at an epoch, open or moving."""

    partition: int
    epoch: int
    state: str = OPEN


@dataclass(frozen=True, slots=True)
class Owner:
    """Where a partition's messages go: a cell, at an epoch; `writable` unless the partition is moving."""

    cell: str
    epoch: int
    state: str = OPEN

    @property
    def writable(self) -> bool:
        return self.state == OPEN


@dataclass(frozen=True, slots=True)
class Fence:
    """What a write to one cell checks in its own transaction: that the cell lists each partition written,
    open, at the epoch given (`epochs`); or, for the one cell of a map that lists nothing (`epochs` None),
    that its list is still empty."""

    epochs: Mapping[int, int] | None

    def holds(self, found: Iterable[CellPartition]) -> bool:
        """Whether the cell's list as the store found it (the rows of the partitions written; for a fence
        of the whole topic, any row) still gives the cell these partitions at these epochs."""
        found = list(found)
        if self.epochs is None:
            return not found
        now = {row.partition: (row.epoch, row.state) for row in found}
        return all(now.get(partition) == (epoch, OPEN) for partition, epoch in self.epochs.items())


WHOLE = Fence(None)

CANCEL, REPLACE = "cancel", "replace"


@dataclass(frozen=True, slots=True)
class Forward:
    """A cancel or a replace a cell's consumer took that may have its message waiting in another cell: a cancel
    that found none in its cell, a replace (whose earlier version may wait elsewhere). It is forwarded to every
    other cell as a cancel of the id there, then forgotten unless noted again since (`noted`)."""

    id: str
    action: str
    noted: object  # when it was noted, as the store says it (only given back to it)


@dataclass(frozen=True)
class CellMap:
    """The map of input partitions to cells. `owners` is empty when the only cell owns every partition
    (`partitions` None: any count will do)."""

    cells: tuple[str, ...]
    owners: Mapping[int, Owner]

    @classmethod
    def build(cls, lists: Mapping[str, Sequence[CellPartition]]) -> "CellMap":
        """The map the cells' lists make (cell name -> what its database lists), in the cells' order;
        CellMapError if they make none."""
        cells = tuple(lists)
        if not cells:
            raise CellMapError("no cell is configured")
        owners: dict[int, Owner] = {}
        tied: set[int] = set()
        for cell, rows in lists.items():
            for row in rows:
                if row.state not in STATES or row.partition < 0 or row.epoch < 1:
                    raise CellMapError(f"cell {cell} lists partition {row.partition} at epoch {row.epoch} in state "
                                       f"{row.state!r}, which is not a row of a cell's list")
                held = owners.get(row.partition)
                if held is None or row.epoch > held.epoch:
                    owners[row.partition] = Owner(cell, row.epoch, row.state)
                    tied.discard(row.partition)
                elif row.epoch == held.epoch:
                    tied.add(row.partition)
        if tied:
            partition = min(tied)
            holders = sorted(c for c, rows in lists.items() for r in rows
                             if r.partition == partition and r.epoch == owners[partition].epoch)
            raise CellMapError(f"partition {partition} is listed by cells {' and '.join(holders)} at the same epoch "
                               f"{owners[partition].epoch}: the map has no single owner for it")
        if not owners and len(cells) > 1:
            raise CellMapError(f"no cell of {', '.join(cells)} lists any input partition: the partitions must be "
                               f"assigned to the cells")
        missing = sorted(set(range(max(owners, default=-1) + 1)) - set(owners))
        if missing:
            raise CellMapError(f"input partition(s) {ranges(missing)} belong to no cell (the cells list "
                               f"{ranges(sorted(owners))})")
        return cls(cells, owners)

    @property
    def partitions(self) -> int | None:
        """The input topic's partition count the map is made for; None when the only cell owns them all."""
        return len(self.owners) if self.owners else None

    def check_topic(self, topic: str, partitions: int) -> None:
        """CellMapError unless the input topic has the partitions the map assigns: a message in a partition
        the map does not know has no cell, and a topic with fewer would leave cells idle."""
        if self.partitions is not None and partitions != self.partitions:
            raise CellMapError(f"input topic {topic} has {partitions} partitions, and the cell map assigns "
                               f"{self.partitions}: the routing of every message by its key depends on the count, so "
                               f"Chronos runs only on a topic of {self.partitions} partitions")

    def owner(self, partition: int) -> Owner:
        """The cell of an input partition (CellMapError for one the map does not know)."""
        if not self.owners:
            return Owner(self.cells[0], 0)
        try:
            return self.owners[partition]
        except KeyError:
            raise CellMapError(f"input partition {partition} belongs to no cell (the map assigns "
                               f"{self.partitions})") from None

    def cell_of(self, partition: int | None, default: str) -> str:
        """The cell of an input partition; `default` for none, or one the map does not know."""
        try:
            return default if partition is None else self.owner(partition).cell
        except CellMapError:
            return default

    def partitions_of(self, cell: str) -> list[int]:
        """The partitions a cell owns (open or moving), in order; every one for the only cell of an empty map
        (then an empty list: their count is the topic's)."""
        return sorted(p for p, owner in self.owners.items() if owner.cell == cell)

    def fence(self, cell: str, partitions: Iterable[int]) -> Fence:
        """The fence of a write of these partitions to `cell`, which owns them all, open; `CellMapChanged` if it
        does not (they were split by cell on an older map)."""
        if not self.owners:
            return WHOLE
        epochs = {}
        for partition in partitions:
            owner = self.owner(partition)
            if owner.cell != cell or not owner.writable:
                raise CellMapChanged(f"partition {partition} is not open in cell {cell}")
            epochs[partition] = owner.epoch
        return Fence(epochs)

    def split(self, items: Iterable[T], partition_of: Callable[[T], int]) -> tuple[dict[str, list[T]], list[T]]:
        """Items by the cell of their partition, each cell's in their order, the cells in the map's order
        (those with none left out); and the items of partitions that are moving (written nowhere now)."""
        if not self.owners:
            listed = list(items)
            return ({self.cells[0]: listed} if listed else {}), []
        by_cell: dict[str, list[T]] = {}
        held: list[T] = []
        for item in items:
            owner = self.owner(partition_of(item))
            if owner.writable:
                by_cell.setdefault(owner.cell, []).append(item)
            else:
                held.append(item)
        return {cell: by_cell[cell] for cell in self.cells if cell in by_cell}, held


def assign(cells: Sequence[str], partitions: int) -> dict[str, list[int]]:
    """A first assignment of `partitions` input partitions to `cells`: contiguous runs, as even as they go
    (the routing spreads messages evenly over the partitions); CellMapError when there are fewer partitions
    than cells."""
    if partitions < len(cells):
        raise CellMapError(f"{len(cells)} cells need at least {len(cells)} input partitions, not {partitions}")
    per, extra = divmod(partitions, len(cells))
    out: dict[str, list[int]] = {}
    start = 0
    for i, cell in enumerate(cells):
        count = per + (1 if i < extra else 0)
        out[cell] = list(range(start, start + count))
        start += count
    return out


def ranges(partitions: Sequence[int]) -> str:
    """Partitions in few words: `0-3, 7, 9-10` for [0, 1, 2, 3, 7, 9, 10] (sorted)."""
    runs: list[list[int]] = []
    for p in partitions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"
