"""A cell's list of input partitions and the fence of the consumer's writes, on PostgreSQL and on the in-memory
twin: the list read, partitions opened and closed, and a write fenced at a stale epoch refused whole."""

from __future__ import annotations

import pytest

from chronos.domain.cells import MOVING, OPEN, WHOLE, CellPartition as P, Fence
from chronos.errors import CellMapChanged
from test_store_contract import insert, row


def test_a_cell_that_lists_nothing_takes_writes_fenced_for_the_whole_topic_until_its_list_is_filled(s, backend):
    t = backend.now_us() + 60_000_000
    assert s.cell_partitions() == []
    assert s.apply([row("a", t)], [], [], fence=WHOLE) == (1, 0, 0, 0)
    assert s.open_partitions([2, 0, 1], 1) == [0, 1, 2]
    assert s.cell_partitions() == [P(0, 1, OPEN), P(1, 1, OPEN), P(2, 1, OPEN)]
    with pytest.raises(CellMapChanged):
        s.apply([row("b", t)], [], ["a"], fence=WHOLE)
    assert backend.ids() == {"a"}  # neither the insert nor the cancel


def test_a_write_fenced_at_a_stale_epoch_is_refused_whole_and_one_at_the_new_epoch_goes_through(s, backend):
    t = backend.now_us() + 60_000_000
    s.open_partitions([0, 1, 2], 1)
    assert s.apply([row("a", t)], [], [], fence=Fence({0: 1, 2: 1})) == (1, 0, 0, 0)
    assert s.close_partitions([2, 9]) == {2: 2}  # 9 is not listed here
    assert s.cell_partitions() == [P(0, 1), P(1, 1), P(2, 2, MOVING)]
    with pytest.raises(CellMapChanged):
        s.apply([row("b", t)], [row("a", t + 5, value=b"new")], ["x"], fence=Fence({0: 1, 2: 1}))
    with pytest.raises(CellMapChanged):  # moving: written nowhere, whatever epoch the writer knows
        s.apply([row("b", t)], [], [], fence=Fence({2: 2}))
    assert backend.ids() == {"a"} and backend.stored("a").value == b"v"
    assert s.apply([row("b", t)], [], [], fence=Fence({0: 1})) == (1, 0, 0, 0)  # the other partitions flow
    # the partition comes back (a move undone, or into another cell): open at a higher epoch
    assert s.open_partitions([2], 3) == [2]
    assert s.apply([row("c", t)], [], [], fence=Fence({2: 3})) == (1, 0, 0, 0)
    assert backend.ids() == {"a", "b", "c"}


def test_a_partition_is_opened_only_at_a_higher_epoch_than_the_one_listed(s):
    assert s.open_partitions([0, 1], 2) == [0, 1]
    assert s.open_partitions([0, 1, 2], 2) == [2]
    assert s.open_partitions([0], 1) == []
    assert s.cell_partitions() == [P(0, 2), P(1, 2), P(2, 2)]


def test_a_fence_naming_a_partition_the_cell_does_not_list_is_refused(s, backend):
    t = backend.now_us() + 60_000_000
    s.open_partitions([0], 1)
    with pytest.raises(CellMapChanged):
        s.apply([row("a", t)], [], [], fence=Fence({0: 1, 5: 1}))
    assert backend.ids() == set()
    assert insert(s, [row("a", t)]) == 1  # an unfenced write (no cells) is not checked
