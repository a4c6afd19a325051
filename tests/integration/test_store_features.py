"""The plans of the claim and the delete against a real PostgreSQL. (What ordering keys, cancel and
replace and recurring schedules do is in the contract suite, tests/contract.)"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store
from helpers import claim_plan


def now_us() -> int:
    return time.time_ns() // 1000


def r(mid, deadline_us, okey=None, value=b"v", **kw) -> Row:
    return Row(mid, deadline_us, None, b"k", value, b"", okey, cron=kw.get("cron"), timezone=kw.get("timezone"))


def store(url) -> Store:
    return Store(url, node_id=uuid.uuid4())


@pytest.mark.parametrize("n", [1])
def test_far_future_rows_do_not_slow_the_claim_plan(database_url, n):
    """The claim uses the due index, so a store full of far-future rows costs it nothing."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline) SELECT 'f' || g, now() + interval '2 years' "
                     "FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE chronos_messages")
        plan = claim_plan(conn)
    assert "chronos_messages_due_sliced" in plan, plan
    # the deadline bound must be an index condition: as a filter, a claim that finds fewer rows
    # than its limit would read every far-future row
    assert "Index Cond: (deadline <=" in plan, plan


def test_deleting_fired_rows_goes_by_tid_even_under_a_generic_plan(database_url):
    """With statistics taken while nothing was in flight, a generic plan of a plain `=` join chose
    the in-flight index and looped over every in-flight row for every id (seconds per batch); the
    claimed rows are reached by the TID the claim returned."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline) SELECT 'f' || g, now() + interval '2 years' "
                     "FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE chronos_messages")
    s = store(database_url)
    s.insert([r(f"d{i}", now_us() - 1000) for i in range(3000)])
    held = s.claim(3000, 0)
    from chronos.adapters.postgres.queries import QUERIES
    sql = (QUERIES["delete_fired"].replace("%(ctids)s", "$1").replace("%(ids)s", "$2")
           .replace("%(readied_at)s", "$3").replace("%(node)s", "$4"))
    with psycopg.connect(database_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE d(tid[], text[], timestamptz[], uuid) AS " + sql)
        plan = "\n".join(row[0] for row in conn.execute(
            "EXPLAIN EXECUTE d(%s::tid[], %s, %s, %s)",
            ([x.ctid for x in held[:1000]], [x.id for x in held[:1000]], [x.readied_at for x in held[:1000]],
             s.node_id)))
    assert "Tid Scan on chronos_messages" in plan, plan
    assert s.delete_fired(held[:1000]) == 1000
