"""What a cell's consumer notes to forward to the other cells, and a forwarded cancel, on PostgreSQL and on the
in-memory twin: a cancel that found nothing here and every replace noted in the write's own transaction
(rolled back with it when its fence fails), a forwarded cancel that deletes wherever the id waits, a forward
forgotten only if it was not noted again meanwhile."""

from __future__ import annotations

import uuid

import pytest

from chronos.domain.cells import CANCEL, REPLACE, Fence
from chronos.errors import CellMapChanged
from test_store_contract import insert, row


def test_cancels_that_found_nothing_and_replaces_are_noted_to_forward(s, backend):
    t = backend.now_us() + 60_000_000
    insert(s, [row("here", t)])
    assert s.apply([row("new", t)], [row("swapped", t)], ["here", "elsewhere"], forward=True) == (1, 1, 1, 0)
    assert sorted((f.id, f.action) for f in s.pending_forwards(10)) == [("elsewhere", CANCEL), ("swapped", REPLACE)]
    s.apply([], [], ["nowhere"])  # without forward (no cells): nothing noted
    assert {f.id for f in s.pending_forwards(10)} == {"swapped", "elsewhere"}
    assert len(s.pending_forwards(1)) == 1


def test_a_write_whose_fence_fails_notes_nothing(s, backend):
    s.open_partitions([0], 1)
    with pytest.raises(CellMapChanged):
        s.apply([], [], ["gone"], fence=Fence({0: 7}), forward=True)
    assert s.pending_forwards(10) == []


def test_a_forwarded_cancel_deletes_wherever_the_id_waits_and_says_what_it_found(backend):
    firer = backend.store(uuid.uuid4())
    now = backend.now_us()
    insert(firer, [row("waiting", now + 60_000_000), row("held", now - 1000)])
    firer.claim(10, 0)
    assert firer.cancel_forwarded(["waiting", "held", "unknown"]) == {"waiting": False, "held": True}
    assert backend.ids() == set()
    assert firer.cancel_forwarded([]) == {}


def test_a_forward_is_forgotten_unless_it_was_noted_again(s, backend):
    s.apply([], [], ["a", "b"], forward=True)
    pending = s.pending_forwards(10)
    s.apply([], [], ["b"], forward=True)  # noted again meanwhile: forwarded again later
    s.forget_forwards(pending)
    assert [f.id for f in s.pending_forwards(10)] == ["b"]
