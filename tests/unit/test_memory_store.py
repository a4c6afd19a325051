"""What only the in-memory store has: its injected clock and its outage switch. Its semantics are
the PostgreSQL store's, tested by the contract suite (tests/contract)."""

from __future__ import annotations

import uuid

import pytest

from chronos.adapters.memory import ManualClock, MemoryDatabase, MemoryStore
from chronos.domain.model import Row
from chronos.errors import StoreUnavailable


def test_time_is_the_database_clock_and_moves_only_when_told():
    clock = ManualClock(1_000_000_000)
    st = MemoryStore(MemoryDatabase(clock), node_id=uuid.uuid4())
    st.apply([Row("m", 1_005_000_000, None, None, b"v", b"")], [], [])
    assert st.db_clock_us() == 1_000_000_000
    assert st.claim(10, 0) == []
    clock.advance(5)
    [m] = st.claim(10, 0)
    assert m.id == "m" and m.deadline_us == st.db_clock_us() == 1_005_000_000


def test_an_outage_fails_every_statement_until_it_ends():
    db = MemoryDatabase(ManualClock())
    st = MemoryStore(db, node_id=uuid.uuid4())
    db.unavailable = "connection refused"
    with pytest.raises(StoreUnavailable, match="connection refused"):
        st.apply([Row("m", 0, None, None, b"v", b"")], [], [])
    with pytest.raises(StoreUnavailable):
        st.claim(10, 0)
    assert st.last_ok == 0.0
    db.unavailable = None
    assert st.apply([Row("m", 0, None, None, b"v", b"")], [], []) == (1, 0, 0, 0)
    assert st.last_ok > 0


def test_handles_share_one_database():
    db = MemoryDatabase(ManualClock())
    MemoryStore(db).apply([Row("m", 0, None, None, b"v", b"")], [], [])
    assert [c.id for c in MemoryStore(db, node_id=uuid.uuid4()).claim(10, 0)] == ["m"]
    assert MemoryStore().claim(10, 0) == []   # a handle made alone has a database of its own

