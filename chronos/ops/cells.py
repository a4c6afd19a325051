"""The map of input partitions to cells, as operators and `chronos up` read and first assign it: every
cell's list read through its store and put together (chronos.domain.cells)."""

from __future__ import annotations

from typing import Mapping

from chronos import ports
from chronos.domain.cells import CellMap, assign

FIRST_EPOCH = 1


def read_map(stores: Mapping[str, ports.IntakeStore]) -> CellMap:
    """The map the cells' lists make, the cells in the order given (CellMapError if they make none)."""
    return CellMap.build({cell: store.cell_partitions() for cell, store in stores.items()})


def assign_map(stores: Mapping[str, ports.Store], partitions: int) -> tuple[CellMap, bool]:
    """The cells' map, and whether it was assigned now: when no cell lists any partition and there are
    several cells, each is given its even share of `partitions` (`chronos.domain.cells.assign`), opened at the
    first epoch. A map already assigned is left as it is, whatever `partitions` says (the caller checks the
    topic against it)."""
    lists = {cell: store.cell_partitions() for cell, store in stores.items()}
    if len(lists) < 2 or any(lists.values()):
        return CellMap.build(lists), False
    for cell, share in assign(list(stores), partitions).items():
        stores[cell].open_partitions(share, FIRST_EPOCH)
    return read_map(stores), True
