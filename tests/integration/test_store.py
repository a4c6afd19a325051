"""The PostgreSQL store's own paths: migrations, exact deadlines and ids through its SQL, its
errors. (What every store does is in the contract suite, tests/contract.)"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from chronos.adapters.postgres import migrations
from chronos.errors import SchemaError, StoreRejected, StoreUnavailable
from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store


def now_us() -> int:
    return time.time_ns() // 1000


def row(i, deadline_us, **kw) -> Row:
    return Row(id=f"m-{i}", deadline_us=deadline_us, topic=kw.get("topic"), key=kw.get("key", b"k"),
               value=kw.get("value", b"v"), headers=kw.get("headers", b""), ordering_key=None)


@pytest.fixture
def s(database_url):
    st = Store(database_url, node_id=uuid.uuid4())
    yield st
    st.close()


def test_migrate_is_idempotent_and_versioned(empty_database_url):
    assert migrations.migrate(empty_database_url) == [m.version for m in migrations.migrations()]
    assert migrations.migrate(empty_database_url) == []
    with psycopg.connect(empty_database_url) as conn:
        migrations.check_schema(conn)


def test_migrations_run_concurrently_once(empty_database_url):
    results = []
    threads = [threading.Thread(target=lambda: results.append(migrations.migrate(empty_database_url)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each migration applied once, by one of them (the one outside a transaction maybe by another migrator
    # than the ones before it: each takes the lock anew), and none failed
    assert len(results) == 3
    assert sorted(v for r in results for v in r) == [m.version for m in migrations.migrations()]


def test_unmigrated_database_is_refused_with_a_hint(empty_database_url):
    with psycopg.connect(empty_database_url) as conn:
        with pytest.raises(SchemaError, match="chronos migrate"):
            migrations.check_schema(conn)


def test_insert_keeps_microsecond_deadlines(s, database_url):
    t = 1_900_000_000_123_456
    s.insert([row(1, t)])
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT (extract(epoch FROM deadline) * 1000000)::bigint FROM chronos_messages"
                            ).fetchone()[0] == t


def test_new_ids_are_copied_straight_in_and_a_batch_read_again_inserts_only_its_new_ids(s, database_url):
    """The common batch (no id waiting yet) goes into the table with one COPY: the session never
    creates the staging table. A batch read again (some ids waiting) is written through it instead,
    inserting the new ids only, in input order, and leaving the waiting rows as they are."""
    t = now_us() + 60_000_000
    assert s.insert([row(3, t), row(1, t), row(2, t)]) == 3
    assert s.conn.execute("SELECT to_regclass('pg_temp.chronos_staging')").fetchone()[0] is None
    assert s.insert([row(5, t), row(1, t + 5, value=b"again"), row(4, t)]) == 2
    with psycopg.connect(database_url) as conn:
        got = conn.execute("SELECT id, value, deadline = (SELECT deadline FROM chronos_messages WHERE id = 'm-3') "
                           "FROM chronos_messages ORDER BY seq").fetchall()
    assert got == [("m-3", b"v", True), ("m-1", b"v", True), ("m-2", b"v", True), ("m-5", b"v", True),
                   ("m-4", b"v", True)]


def test_ids_with_quotes_backslashes_percent_and_unicode_are_stored_verbatim(s):
    ids = ["it's", 'say "hi"', "back\\slash", "100%s", "%(x)s", "naïve-日本-🚀", "a;DROP TABLE x",
           "{braces}", "a,b", "NULL", "", " spaced ", "\\\"", "tab\tnew\nline"]
    t = now_us() - 1000
    s.insert([Row(i, t, None, b"k", b"v", b"") for i in ids])
    claimed = s.claim(100, 0)
    assert sorted(r.id for r in claimed) == sorted(ids)
    # handed back and deleted by exactly these ids (array literals are built by hand on this path)
    assert s.release(claimed) == len(ids)
    claimed = s.claim(100, 0)
    assert s.delete_fired(claimed) == len(ids)
    assert s.claim(100, 0) == []


def test_store_unavailable_is_translated(pg_server):
    st = Store(pg_server.url.rsplit(":", 1)[0] + ":1/postgres")
    with pytest.raises(StoreUnavailable):
        st.claim(1, 0)


def test_data_postgres_refuses_is_rejected_not_unavailable(s):
    with pytest.raises(StoreRejected):
        s.insert([Row("nul\x00id", now_us(), None, None, None, b"")])
    assert s.insert([row(1, now_us())]) == 1  # the connection is still usable
