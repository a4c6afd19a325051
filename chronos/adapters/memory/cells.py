"""Changes of this cell's list of input partitions on the in-memory database (`ports.CellMapStore`); each one
statement, so no write checks its fence halfway through one."""

from __future__ import annotations

from typing import Sequence

from chronos.adapters.memory.base import MemoryHandle
from chronos.domain.cells import MOVING, OPEN, CellPartition


class MemoryCellMap(MemoryHandle):
    """The map's side of the twin."""

    def open_partitions(self, partitions: Sequence[int], epoch: int) -> list[int]:
        """List these partitions here, open, at `epoch` (one listed at `epoch` or higher left as it is);
        returns those opened."""
        def run(now: int) -> list[int]:
            listed = self.db.cell_partitions
            opened = [p for p in dict.fromkeys(partitions) if p not in listed or listed[p].epoch < epoch]
            for p in opened:
                listed[p] = CellPartition(p, epoch, OPEN)
            return sorted(opened)
        return self._run(run)

    def close_partitions(self, partitions: Sequence[int]) -> dict[int, int]:
        """Mark these partitions moving at their epoch + 1; returns partition -> new epoch."""
        def run(now: int) -> dict[int, int]:
            listed = self.db.cell_partitions
            closed = {}
            for p in sorted(set(partitions) & listed.keys()):
                listed[p] = CellPartition(p, listed[p].epoch + 1, MOVING)
                closed[p] = listed[p].epoch
            return closed
        return self._run(run)
