"""Every SQL path, against a real PostgreSQL."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from chronos.adapters.postgres import store
from chronos.errors import SchemaError
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


def count(url, where="true") -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT count(*) FROM chronos_messages WHERE {where}").fetchone()[0]


def test_migrate_is_idempotent_and_versioned(empty_database_url):
    assert store.migrate(empty_database_url) == [v for v, _, _ in store.migrations()]
    assert store.migrate(empty_database_url) == []
    with psycopg.connect(empty_database_url) as conn:
        store.check_schema(conn)


def test_migrations_run_concurrently_once(empty_database_url):
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.migrate(empty_database_url)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(r) for r in results) == [0, 0, len(store.migrations())]


def test_unmigrated_database_is_refused_with_a_hint(empty_database_url):
    with psycopg.connect(empty_database_url) as conn:
        with pytest.raises(SchemaError, match="chronos migrate"):
            store.check_schema(conn)


def test_insert_ignores_duplicate_ids_and_keeps_bytes(s, database_url):
    t = now_us() + 60_000_000
    assert s.insert([row(1, t, key=None, value=None), row(2, t, value=b"\x00\xff")]) == 2
    assert s.insert([row(1, t + 5, value=b"other"), row(3, t)]) == 1
    with psycopg.connect(database_url) as conn:
        got = dict(conn.execute("SELECT id, value FROM chronos_messages").fetchall())
    assert got == {"m-1": None, "m-2": b"\x00\xff", "m-3": b"v"}


def test_insert_keeps_microsecond_deadlines(s, database_url):
    t = 1_900_000_000_123_456
    s.insert([row(1, t)])
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT (extract(epoch FROM deadline) * 1000000)::bigint FROM chronos_messages"
                            ).fetchone()[0] == t


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


def test_claim_takes_due_rows_in_deadline_order_within_limit(s):
    base = now_us()
    s.insert([row(i, base - 1_000_000 + i * 1000) for i in range(10)] + [row(99, base + 3_600_000_000)])
    first = s.claim(4, 0)
    assert [r.id for r in first] == ["m-0", "m-1", "m-2", "m-3"]
    rest = s.claim(100, 0)
    assert [r.id for r in rest] == [f"m-{i}" for i in range(4, 10)]  # far-future row not claimed
    assert s.claim(100, 0) == []


def test_claim_lookahead_takes_rows_due_soon(s):
    base = now_us()
    s.insert([row(1, base + 200_000), row(2, base + 5_000_000)])
    assert [r.id for r in s.claim(10, 1000)] == ["m-1"]


def test_two_competing_firers_never_claim_a_row_twice(database_url):
    base = now_us() - 1_000_000
    Store(database_url).insert([row(i, base + i) for i in range(3000)])
    got: list[list[str]] = [[], [], []]

    def firer(n):
        st = Store(database_url, node_id=uuid.uuid4())
        while True:
            rows = st.claim(50, 0)
            if not rows:
                break
            got[n].extend(r.id for r in rows)
        st.close()

    threads = [threading.Thread(target=firer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = got[0] + got[1] + got[2]
    assert len(every) == 3000 and len(set(every)) == 3000
    assert all(got), "every firer should have claimed something"


def test_delete_only_rows_still_owned_as_claimed(database_url):
    a, b = Store(database_url, node_id=uuid.uuid4()), Store(database_url, node_id=uuid.uuid4())
    a.insert([row(i, now_us() - 1000) for i in range(3)])
    claimed = a.claim(10, 0)
    assert len(claimed) == 3
    # a peer took over m-0 after a reset; m-1 was reset and not yet re-claimed
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_messages SET readied_at = NULL, readied_by = NULL WHERE id IN ('m-0','m-1')")
    assert [r.id for r in b.claim(1, 0)] == ["m-0"]
    assert a.delete_fired(claimed) == 1
    assert count(database_url) == 2


def test_release_hands_rows_back(s, database_url):
    s.insert([row(1, now_us() - 1000)])
    claimed = s.claim(10, 0)
    assert s.release(claimed) == 1
    assert count(database_url, "readied_at IS NULL") == 1
    assert [r.id for r in s.claim(10, 0)] == ["m-1"]


def test_detector_resets_only_rows_unchanged_since_seen(database_url):
    firer = Store(database_url, node_id=uuid.uuid4())
    det = Store(database_url)
    firer.insert([row(i, now_us() - 1000) for i in range(3)])
    firer.claim(10, 0)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_messages SET readied_at = readied_at - interval '10 seconds'")
    assert det.find_stale(hold_ms=60_000) == []
    seen = det.find_stale(hold_ms=5000)
    assert len(seen) == 3
    # between the read and the reset: m-0 fired and deleted, m-1 re-claimed by a peer
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM chronos_messages WHERE id = 'm-0'")
        conn.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = %s WHERE id = 'm-1'",
                     (uuid.uuid4(),))
    reset = det.reset_stale(seen)
    assert reset == [firer.node_id]
    assert count(database_url, "readied_at IS NULL") == 1


def test_store_unavailable_is_translated(pg_server):
    st = Store(pg_server.url.rsplit(":", 1)[0] + ":1/postgres")
    with pytest.raises(store.StoreUnavailable):
        st.claim(1, 0)


def test_data_postgres_refuses_is_rejected_not_unavailable(s):
    with pytest.raises(store.StoreRejected):
        s.insert([Row("nul\x00id", now_us(), None, None, None, b"")])
    assert s.insert([row(1, now_us())]) == 1  # the connection is still usable
