"""The first map of the cells' input partitions, as `chronos migrate --partitions` assigns it
(chronos.ops.cells.first_map), on in-memory cells: assigned among cells that list none, finished when a first
assignment stopped half way, left alone once the cells make a map, and refused when asked for without a count."""

from __future__ import annotations

import pytest

from chronos.adapters.memory import MemoryDatabase, MemoryStore
from chronos.domain.cells import CellMapError
from chronos.ops.cells import first_map


@pytest.fixture
def cells():
    return {cell: MemoryStore(MemoryDatabase()) for cell in ("a", "b", "c")}


def listed(stores) -> dict[str, list[int]]:
    return {cell: [row.partition for row in store.cell_partitions()] for cell, store in stores.items()}


def test_the_partitions_are_assigned_among_cells_that_list_none(cells):
    with pytest.raises(CellMapError, match="list no input partition yet: give --partitions"):
        first_map(cells, None)
    cell_map, given = first_map(cells, 8)
    assert given == ["a", "b", "c"] and cell_map.partitions == 8
    assert listed(cells) == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    # run again: the map stands, and a count that is not its own is refused
    assert first_map(cells, None)[1] == [] and first_map(cells, 8)[1] == []
    with pytest.raises(CellMapError, match="assigns 8 input partitions, not 6"):
        first_map(cells, 6)


def test_a_first_assignment_that_stopped_half_way_is_finished(cells):
    cells["a"].open_partitions([0, 1, 2], 1)
    cell_map, given = first_map(cells, 8)
    assert given == ["b", "c"] and listed(cells) == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    assert cell_map.owner(7).cell == "c"


def test_cells_that_list_what_no_first_assignment_gives_are_refused(cells):
    cells["a"].open_partitions([5], 1)
    with pytest.raises(CellMapError, match="cell a lists partitions 5, which a first assignment"):
        first_map(cells, 8)
    assert listed(cells)["b"] == []


def test_a_map_the_cells_make_stands_with_a_cell_that_owns_nothing_yet(cells):
    cells["a"].open_partitions([0, 1], 1)
    cells["b"].open_partitions([2, 3], 1)
    cell_map, given = first_map(cells, 4)
    assert given == [] and listed(cells)["c"] == [] and cell_map.partitions_of("c") == []


def test_one_cell_owns_every_partition_by_itself():
    alone = {"a": MemoryStore(MemoryDatabase())}
    cell_map, given = first_map(alone, None)
    assert given == [] and cell_map.owners == {}
