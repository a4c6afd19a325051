"""The map of input partitions to cells (chronos.domain.cells): made from what each cell lists, the owner of
each partition, the fence of a write, the batch split by cell, the topic a map refuses."""

from __future__ import annotations

import pytest

from chronos.domain.cells import (MOVING, OPEN, WHOLE, CellMap, CellMapError, CellPartition as P, Fence, Owner, assign,
                                  ranges)
from chronos.errors import CellMapChanged


def test_one_cell_that_lists_nothing_owns_every_partition_of_any_topic():
    m = CellMap.build({"main": []})
    assert m.partitions is None
    m.check_topic("in", 1)
    m.check_topic("in", 48)
    assert m.owner(37) == Owner("main", 0)
    assert m.fence("main", [0, 37]) == WHOLE
    assert m.split(["a", "b"], len) == ({"main": ["a", "b"]}, [])
    assert m.split([], len) == ({}, [])


def test_each_partition_belongs_to_the_cell_that_lists_it_and_the_higher_epoch_wins_a_move():
    m = CellMap.build({"a": [P(0, 1), P(1, 1), P(2, 4, MOVING)], "b": [P(2, 5), P(3, 1)], "c": []})
    assert m.partitions == 4
    assert [m.owner(p) for p in range(4)] == [Owner("a", 1), Owner("a", 1), Owner("b", 5), Owner("b", 1)]
    assert m.partitions_of("a") == [0, 1] and m.partitions_of("b") == [2, 3] and m.partitions_of("c") == []
    assert m.fence("b", [3, 2]) == Fence({3: 1, 2: 5})
    # moving, with no cell that opened it since: written nowhere
    moving = CellMap.build({"a": [P(0, 1), P(1, 2, MOVING)], "b": []})
    assert not moving.owner(1).writable
    with pytest.raises(CellMapChanged):
        moving.fence("a", [1])
    with pytest.raises(CellMapChanged):
        m.fence("a", [3])
    # where a parked message is kept: its partition's cell, or the one given for none or one the map does not know
    assert (m.cell_of(3, "a"), m.cell_of(None, "a"), m.cell_of(9, "c")) == ("b", "a", "c")


def test_a_batch_is_split_by_cell_in_order_and_a_moving_partitions_messages_are_held():
    m = CellMap.build({"a": [P(0, 1), P(1, 2, MOVING)], "b": [P(2, 1), P(3, 1)]})
    messages = [(3, "x"), (0, "y"), (1, "z"), (2, "w"), (0, "v")]
    by_cell, held = m.split(messages, lambda msg: msg[0])
    assert by_cell == {"a": [(0, "y"), (0, "v")], "b": [(3, "x"), (2, "w")]}
    assert list(by_cell) == ["a", "b"]
    assert held == [(1, "z")]


def test_a_map_refuses_an_input_topic_of_another_partition_count():
    m = CellMap.build({"a": [P(0, 1), P(1, 1)], "b": [P(2, 1), P(3, 1)]})
    m.check_topic("in", 4)
    for count in (3, 5):
        with pytest.raises(CellMapError, match=f"input topic in has {count} partitions, and the cell map assigns 4"):
            m.check_topic("in", count)
    with pytest.raises(CellMapError, match="partition 7 belongs to no cell"):
        m.owner(7)


@pytest.mark.parametrize("lists,error", [
    ({"a": [P(0, 1), P(2, 1)], "b": [P(5, 1)]}, r"input partition\(s\) 1, 3-4 belong to no cell"),
    ({"a": [P(0, 3)], "b": [P(0, 3)]}, "partition 0 is listed by cells a and b at the same epoch 3"),
    ({"a": [], "b": []}, "no cell of a, b lists any input partition"),
    ({"a": [P(0, 0)]}, "not a row of a cell's list"),
    ({"a": [P(0, 1, "closed")]}, "not a row of a cell's list"),
    ({}, "no cell is configured"),
])
def test_lists_that_make_no_map_are_refused_with_the_reason(lists, error):
    with pytest.raises(CellMapError, match=error):
        CellMap.build(lists)


def test_a_tie_is_settled_by_a_higher_epoch_elsewhere():
    m = CellMap.build({"a": [P(0, 3)], "b": [P(0, 3)], "c": [P(0, 4)]})
    assert m.owner(0) == Owner("c", 4)


def test_a_fence_holds_while_the_cell_lists_its_partitions_open_at_its_epochs():
    fence = Fence({0: 1, 2: 5})
    assert fence.holds([P(0, 1), P(2, 5)])
    assert not fence.holds([P(0, 1)])                       # moved away (gone from the list)
    assert not fence.holds([P(0, 1), P(2, 6, MOVING)])      # closed for a move
    assert not fence.holds([P(0, 1), P(2, 7, OPEN)])        # moved and back: a map newer than the writer's
    assert WHOLE.holds([])
    assert not WHOLE.holds([P(0, 1)])                       # the map was filled since


def test_a_first_assignment_gives_each_cell_a_contiguous_even_share():
    assert assign(["a", "b"], 4) == {"a": [0, 1], "b": [2, 3]}
    assert assign(["a", "b", "c"], 8) == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    assert assign(["only"], 3) == {"only": [0, 1, 2]}
    with pytest.raises(CellMapError, match="3 cells need at least 3 input partitions, not 2"):
        assign(["a", "b", "c"], 2)
    assert ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10" and ranges([]) == "none"
