"""The fence of the consumer's writes against changes of a cell's list, on PostgreSQL, with the two racing: a
change waits for a fenced write that has checked its fence and not committed yet, and a write whose fence
check waited for a change sees the change and is refused. Together: no write of a partition at an epoch the
list no longer gives commits after the change. A cell on a schema before cells says so."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from chronos.adapters.postgres import migrations
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.store import Store
from chronos.domain.cells import Fence
from chronos.domain.model import Row
from chronos.errors import CellMapChanged, CellsUnsupported
from helpers import wait_for


def row(mid: str) -> Row:
    return Row(mid, time.time_ns() // 1000 + 60_000_000, None, None, b"v", b"")


def waiting_on_the_list(url: str) -> bool:
    """Whether a session waits for a lock on chronos_cell_partitions."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted "
                            "AND relation = 'chronos_cell_partitions'::regclass").fetchone()[0] > 0


@pytest.fixture
def stores(database_url):
    made = [Store(database_url, node_id=uuid.uuid4()) for _ in range(2)]
    yield made
    for st in made:
        st.close()


def test_a_change_of_the_list_waits_for_a_fenced_write_that_has_checked_its_fence(database_url, stores):
    writer, mover = stores
    writer.open_partitions([0, 1], 1)
    with psycopg.connect(database_url) as conn, ThreadPoolExecutor(1) as pool:
        # a consumer's write at its last statement: written, fence checked, not committed yet
        conn.execute("INSERT INTO chronos_messages (id, deadline) VALUES ('in-flight', now() + interval '1 hour')")
        assert conn.execute(QUERIES["cell_fence"], {"partitions": [0]}).fetchall() == [(0, 1, "open")]
        closing = pool.submit(mover.close_partitions, [0])
        wait_for(lambda: waiting_on_the_list(database_url), 10, "the change waiting for the write")
        assert not closing.done()
        conn.commit()
        assert closing.result(10) == {0: 2}
    with pytest.raises(CellMapChanged):
        writer.apply([row("late")], [], [], fence=Fence({0: 1}))
    assert writer.waiting_ids(["in-flight", "late"]) == {"in-flight"}


@pytest.mark.parametrize("listed,change,params,fence", [
    ([0, 1], "close_cell_partitions", {"partitions": [1]}, Fence({0: 1, 1: 1})),
    # a list filled while a write fenced for the whole topic (the one cell of an empty list) checks it
    ([], "open_cell_partitions", {"partitions": [0, 1], "epoch": 1}, Fence(None)),
], ids=["closed", "filled"])
def test_a_write_whose_fence_waited_for_a_change_sees_it_and_is_refused(database_url, stores, listed, change, params,
                                                                        fence):
    writer, _ = stores
    writer.open_partitions(listed, 1)
    with psycopg.connect(database_url) as conn, ThreadPoolExecutor(1) as pool:
        # a change of the list under way (what close_partitions or open_partitions runs), not committed yet
        conn.execute(QUERIES["cell_map_lock"])
        conn.execute(QUERIES[change], params)
        writing = pool.submit(writer.apply, [row("a"), row("b")], [], [], fence)
        wait_for(lambda: waiting_on_the_list(database_url), 10, "the write's fence waiting for the change")
        conn.commit()
        with pytest.raises(CellMapChanged):
            writing.result(10)
    assert writer.waiting_ids(["a", "b"]) == set()
    assert writer.apply([row("a")], [], [], fence=Fence({0: 1})) == (1, 0, 0, 0)


def test_a_cell_on_a_schema_before_cells_says_to_migrate(empty_database_url):
    assert migrations.migrate(empty_database_url, [m for m in migrations.migrations() if m.version <= 10])[-1] == 10
    st = Store(empty_database_url)
    try:
        with pytest.raises(CellsUnsupported, match="run `chronos migrate`"):
            st.cell_partitions()
        assert migrations.migrate(empty_database_url) == list(range(11, migrations.LATEST_VERSION + 1))
        assert st.cell_partitions() == []
    finally:
        st.close()
