"""`chronos key-search`: the index a search by key reads, built and dropped at an operator's word on a real
PostgreSQL, and what a search by key finds and says with it and without it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import pytest

from chronos import codec
from chronos.adapters.postgres import key_search
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Row
from chronos.errors import SchemaError, StoreRejected

NOTE = "has no key-search index: this search reads the rows in deadline order"


def cli(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")}
    return subprocess.run([sys.executable, "-m", "chronos", *args], capture_output=True, text=True,
                          env={**env, "CHRONOS_DATABASE_URL": url}, timeout=60)


def fill(url: str) -> None:
    now = time.time_ns() // 1000
    rows = [Row(f"m-{i}", now + 3_600_000_000 + i, None, b"customer-%d" % (i % 3), b"v", codec.encode_headers([]))
            for i in range(30)]
    store = Store(url)
    try:
        store.insert(rows)
    finally:
        store.close()


def test_a_migrated_database_has_no_key_search_index_until_an_operator_builds_one(database_url):
    fill(database_url)
    assert key_search.state(database_url) == key_search.KeySearch(key_search.OFF)
    listed = cli(database_url, "list", "--key", "customer-1")
    assert listed.returncode == 0, listed.stderr
    without = [line.split()[2] for line in listed.stdout.splitlines() if "waiting" in line]
    assert len(without) == 10 and NOTE in listed.stderr

    built = cli(database_url, "key-search", "on")
    assert built.returncode == 0 and "built the key-search index chronos_messages_key_hash" in built.stdout, built.stderr
    found = key_search.state(database_url)
    assert found.state == key_search.ON and found.size_bytes > 0
    assert cli(database_url, "key-search").stdout.startswith("key search on: index chronos_messages_key_hash (")
    again = cli(database_url, "key-search", "on")
    assert again.returncode == 0 and "already on:" in again.stdout

    listed = cli(database_url, "list", "--key", "customer-1")
    assert [line.split()[2] for line in listed.stdout.splitlines() if "waiting" in line] == without
    assert NOTE not in listed.stderr
    with psycopg.connect(database_url) as conn:  # the search reads the index (the planner told to prefer it)
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT id FROM chronos_messages WHERE key IS NOT NULL AND readied_at IS NULL "
            "AND hashtext(encode(key, 'hex')) = hashtext(encode('customer-1'::bytea, 'hex'))"))
    assert "chronos_messages_key_hash" in plan, plan

    dropped = cli(database_url, "key-search", "off")
    assert dropped.returncode == 0 and dropped.stdout.strip() == "dropped the key-search index"
    assert key_search.state(database_url).state == key_search.OFF
    assert cli(database_url, "key-search", "off").stdout.strip() == "key search already off"
    assert cli(database_url, "key-search").stdout.startswith("key search off: a search by key reads the rows")


def test_a_build_that_did_not_finish_is_said_and_built_again(database_url):
    fill(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:  # a concurrent build that fails leaves its index
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY chronos_messages_key_hash ON chronos_messages (value)")
    assert key_search.state(database_url).state == key_search.INVALID
    said = cli(database_url, "key-search")
    assert "key search invalid: a build of chronos_messages_key_hash did not finish" in said.stdout
    assert NOTE in cli(database_url, "list", "--key", "customer-1").stderr
    now, built = key_search.turn_on(database_url)
    assert built and now.state == key_search.ON
    with psycopg.connect(database_url) as conn:  # the index built again is the key's, not the one left invalid
        definition = conn.execute("SELECT pg_get_indexdef('chronos_messages_key_hash'::regclass)").fetchone()[0]
    assert "hashtext(encode(key, 'hex'::text))" in definition and "UNIQUE" not in definition


def test_a_database_not_migrated_or_a_role_that_may_not_build_is_told_in_one_line(empty_database_url, database_url):
    with pytest.raises(SchemaError, match="run `chronos migrate` first"):
        key_search.state(empty_database_url)
    done = cli(empty_database_url, "key-search", "on")
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS chronos_key_reader")
        conn.execute("CREATE ROLE chronos_key_reader LOGIN PASSWORD 'pw'")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO chronos_key_reader")
    reader = psycopg.conninfo.make_conninfo(database_url, user="chronos_key_reader", password="pw")
    try:
        with pytest.raises(StoreRejected, match="must be owner of table chronos_messages"):
            key_search.turn_on(reader)
        assert key_search.state(reader).state == key_search.OFF
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP OWNED BY chronos_key_reader")
            conn.execute("DROP ROLE chronos_key_reader")


def test_with_cells_each_cell_s_index_is_built_and_said(two_cells):
    cells = " ".join(f"{name}={url}" for name, url in two_cells.items())
    key_search.turn_on(two_cells["b"])
    built = cli(two_cells["a"], "key-search", "on", "--cells", cells)
    assert built.returncode == 0, built.stderr
    lines = built.stdout.splitlines()
    assert lines[0].startswith("cell a: built the key-search index") and lines[1].startswith("cell b: already on:")
    key_search.turn_off(two_cells["a"])
    said = cli(two_cells["a"], "key-search", "--cells", cells).stdout.splitlines()
    assert said[0].startswith("cell a: key search off") and said[1].startswith("cell b: key search on")
    listed = cli(two_cells["a"], "list", "--key", "customer-1", "--cells", cells)
    assert listed.returncode == 0 and "note: cell a has no key-search index" in listed.stderr, listed.stderr
    assert "cell b" not in listed.stderr
