"""Operators' queries and actions (chronos/ops/inspect.py) on what only PostgreSQL has: an action racing a
claim's row lock, and the plans of the list filters on a 10-million-row table. (What every store does for
operators is in tests/contract/test_operators_contract.py.)"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime, timezone

import psycopg
import pytest

from chronos import codec
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.operators import list_params
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Row
from chronos.domain.operators import Filters
from chronos.ops import inspect

OUT = "chronos.output"


def now_us() -> int:
    return time.time_ns() // 1000


def r(mid: str, deadline_us: int) -> Row:
    return Row(mid, deadline_us, None, b"k", b"v", codec.encode_headers([]))


@pytest.fixture
def s(database_url):
    st = Store(database_url)
    yield st
    st.close()


def deadline_of(url: str, mid: str) -> datetime | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT deadline FROM chronos_messages WHERE id = %s", (mid,)).fetchone()
    return row[0] if row else None


# -- an action racing a claim -----------------------------------------------------------------------

def test_a_claim_racing_an_action_wins_or_loses_whole(s, database_url):
    """The action's UPDATE/DELETE re-reads a row a concurrent claim locked: it then sees it claimed and
    leaves it; the firer never finds its row changed under it."""
    s.insert([r("race", now_us() - 1000)])
    with psycopg.connect(database_url) as conn:  # a firer's claim, not yet committed
        conn.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = gen_random_uuid() "
                     "WHERE id = 'race'")
        out = {}
        t = threading.Thread(target=lambda: out.update(res=inspect.act(Store(database_url), "cancel", ids=["race"],
                                                                         output_topic=OUT)))
        t.start()
        time.sleep(0.3)  # the action is blocked on the claim's row lock: it cannot finish before the commit
        assert t.is_alive()
        conn.commit()
        t.join(10)
    res = out["res"]
    assert res.changed == 0 and res.in_flight == ["race"]
    assert deadline_of(database_url, "race") is not None


# -- plans with 10 million rows --------------------------------------------------------------------

FAKE_ROWS = 10_000_000


def forge_statistics(conn) -> None:
    """Tell the planner the table holds 10 million waiting rows (PostgreSQL 18's statistics import):
    1% sent to other topics, keys nearly unique, 1% with one of 100,000 ordering keys.

    The planner scales reltuples/relpages by the relation's real size in pages, so each relation gets
    one page holding all its forged rows, and one real row so that it has that page. With the key-search index
    (`chronos key-search on`), which a search by key reads."""
    conn.execute(QUERIES["create_key_search_index"])
    conn.execute("INSERT INTO chronos_messages (id, deadline, key, topic, ordering_key) "
                 "VALUES ('seed', now() + interval '1 year', 'seed', 't.seed', 'seed')")
    for rel, rows in (("chronos_messages", FAKE_ROWS), ("chronos_messages_pkey", FAKE_ROWS),
                      ("chronos_messages_due_sliced", FAKE_ROWS), ("chronos_messages_topic", FAKE_ROWS // 100),
                      ("chronos_messages_key_hash", FAKE_ROWS), ("chronos_messages_ordering", FAKE_ROWS // 100),
                      ("chronos_messages_readied", 1000), ("chronos_messages_schedules", 1000)):
        pages = conn.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                             (rel,)).fetchone()[0]
        conn.execute("SELECT pg_restore_relation_stats('schemaname', 'public', 'relname', %s::text, "
                     "'relpages', %s::integer, 'reltuples', %s::real)", (rel, pages, float(rows)))
    for column, null_frac, n_distinct in (("topic", 0.99, 20.0), ("key", 0.0, -0.9), ("ordering_key", 0.99, 100000.0),
                                          ("readied_at", 0.9999, -1.0), ("cron", 0.9999, 1000.0),
                                          ("id", 0.0, -1.0), ("deadline", 0.0, -1.0), ("seq", 0.0, -1.0)):
        conn.execute("SELECT pg_restore_attribute_stats('schemaname', 'public', 'relname', 'chronos_messages', "
                     "'attname', %s::text, 'inherited', false, 'null_frac', %s::real, 'avg_width', 16, "
                     "'n_distinct', %s::real)", (column, null_frac, n_distinct))
    # the key's hash, as ANALYZE gathers it for the expression the key's index holds: nearly unique too
    conn.execute("SELECT pg_restore_attribute_stats('schemaname', 'public', 'relname', 'chronos_messages_key_hash', "
                 "'attname', 'hashtext', 'inherited', false, 'null_frac', 0::real, 'avg_width', 4, "
                 "'n_distinct', -0.9::real)")


def plan(conn, f: Filters, after: str | tuple[int, int] | None = None) -> str:
    params = list_params(f, 50, after=after)
    sql = QUERIES["list_by_id" if f.id_prefix else "list_by_deadline"]
    with conn.cursor() as cur:
        cur.execute("EXPLAIN " + sql, params, prepare=False)
        return "\n".join(row[0] for row in cur.fetchall())


LATER = datetime(2030, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("f, index", [
    (Filters(), "chronos_messages_due_sliced"),
    (Filters(state="waiting"), "chronos_messages_due_sliced"),
    (Filters(state="in_flight"), "chronos_messages_readied"),
    (Filters(state="recurring"), "chronos_messages_schedules"),
    (Filters(due_after=LATER), "chronos_messages_due_sliced"),
    (Filters(due_before=LATER, state="waiting"), "chronos_messages_due_sliced"),
    (Filters(topic="t.other"), "chronos_messages_topic"),
    (Filters(output_topic=True, state="waiting"), "chronos_messages_due_sliced"),
    (Filters(key=b"customer-17"), "chronos_messages_key_hash"),
    (Filters(ordering_key="invoice-9"), "chronos_messages_ordering"),
    (Filters(id_prefix="order-17"), "chronos_messages_pkey"),
    (Filters(id_prefix="order-", state="waiting", key=b"k"), "chronos_messages_"),
])
def test_every_list_filter_is_served_by_an_index_on_ten_million_rows(database_url, f, index):
    with psycopg.connect(database_url, autocommit=True) as conn:
        forge_statistics(conn)
        assert conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'chronos_messages'").fetchone()[0] \
            == FAKE_ROWS
        text = plan(conn, f)
        nxt = plan(conn, f, after="order-17x" if f.id_prefix else (1_900_000_000_000_000, 42))
    for p in (text, nxt):
        assert "Seq Scan" not in p, p
        assert index in p, p
        # the first page costs next to nothing: no sort of every match (a sort or a scan of 10M rows
        # costs 100,000 and more in the planner's units; the key's B-tree, of two pages for ten million
        # forged rows, about 1,600 for its one match)
        total = float(re.match(r"^\S.*?cost=[0-9.]+\.\.([0-9.]+) ", p).group(1))
        assert total < 5000, p
    if f.id_prefix == "order-17":
        assert "Index Cond: ((id >= 'order-17'::text) AND (id < 'order-18'::text))" in text, text
