"""The map of input partitions to cells, as operators and `chronos up` read and first assign it: every
cell's list read through its store and put together (chronos.domain.cells)."""

from __future__ import annotations

from typing import Mapping

from chronos import ports
from chronos.domain.cells import CellMap, CellMapError, assign, ranges

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


def first_map(stores: Mapping[str, ports.Store], partitions: int | None) -> tuple[CellMap, list[str]]:
    """The cells' map, `partitions` input partitions assigned among them when none is yet (`chronos migrate
    --partitions`): each cell that lists none is given its even share (`assign`), so that a first assignment that
    stopped half way is finished when run again. A map the cells make already stands (`partitions`, if given, must
    be its count); one cell owns every partition by itself. The map, and the cells given their share now (a
    CellMapError when the cells list what no first assignment of `partitions` gives them)."""
    lists = {cell: store.cell_partitions() for cell, store in stores.items()}
    if len(lists) < 2:
        return CellMap.build(lists), []
    cell_map, error = None, None
    if any(lists.values()):
        try:
            cell_map = CellMap.build(lists)
        except CellMapError as exc:  # a first assignment half done, or the cells' own error
            error = exc
    if cell_map is not None and (partitions is None or cell_map.partitions == partitions):
        return cell_map, []
    if partitions is None:
        raise error or CellMapError(f"cells {', '.join(lists)} list no input partition yet: give --partitions, the "
                                    "input topic's partition count, to assign them among the cells")
    shares = assign(list(stores), partitions)
    for cell, rows in lists.items():
        if rows and [row.partition for row in rows] != shares[cell]:
            if cell_map is not None:
                raise CellMapError(f"the cells' map assigns {cell_map.partitions} input partitions, not {partitions}")
            raise CellMapError(f"cell {cell} lists partitions {ranges([row.partition for row in rows])}, which a "
                               f"first assignment of {partitions} partitions does not give it "
                               f"({ranges(shares[cell])})")
    given = [cell for cell, rows in lists.items() if not rows]
    for cell in given:
        stores[cell].open_partitions(shares[cell], FIRST_EPOCH)
    return read_map(stores), given
