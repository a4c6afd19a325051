"""Migrations for rolling upgrades, on a real PostgreSQL: the compatibility window each migration records
and the processes of an older release read, and migrations that run outside a transaction (CREATE INDEX
CONCURRENTLY), resumable after an interrupted build."""

from __future__ import annotations

import psycopg
import pytest

from chronos.adapters.postgres import migrations
from chronos.adapters.postgres.migrations import Migration
from chronos.errors import SchemaError

LATEST = migrations.LATEST_VERSION


def newer(version: int, compatible_from: int | None, sql: str = "SELECT 1", outside: bool = False) -> Migration:
    """A migration of a release after this one."""
    return Migration(version, f"later_{version}", sql, version if compatible_from is None else compatible_from,
                     outside)


def check(url: str) -> None:
    with psycopg.connect(url) as conn:
        migrations.check_schema(conn)


def test_this_release_runs_on_a_newer_schema_within_its_compatibility_window(database_url):
    """A newer release migrated with a migration that only adds (compatible from this release's version):
    this release's processes start on it. One that is not compatible stops them, naming the window."""
    assert migrations.migrate(database_url, migrations.migrations() + [newer(LATEST + 1, LATEST)]) == [LATEST + 1]
    check(database_url)
    assert migrations.migrate(database_url, migrations.migrations() + [newer(LATEST + 1, LATEST),
                                                                       newer(LATEST + 2, None)]) == [LATEST + 2]
    with pytest.raises(SchemaError, match=rf"newer than this chronos \({LATEST}\) and outside its compatibility "
                                          rf"window: migration {LATEST + 2} runs only with processes of version "
                                          rf"{LATEST + 2} or newer"):
        check(database_url)
    # `chronos migrate` of this release never goes back: the schema stays, a rollback runs on it
    with pytest.raises(SchemaError, match="newer than this chronos"):
        migrations.migrate(database_url)


def test_the_window_is_recorded_for_every_migration(empty_database_url):
    migrations.migrate(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        recorded = dict(conn.execute("SELECT version, compatible_from FROM chronos_schema_version").fetchall())
    assert recorded == {m.version: m.compatible_from for m in migrations.migrations()}


def test_a_schema_table_from_before_the_window_gets_its_column(empty_database_url):
    """A database migrated by a release that recorded no window: its rows stay compatible with their own
    version only, and the next migration records its window."""
    first = migrations.migrations()[:2]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE chronos_schema_version (version integer PRIMARY KEY, name text NOT NULL, "
                     "applied_at timestamptz NOT NULL DEFAULT now())")
        for m in first:
            conn.execute(m.sql)
            conn.execute("INSERT INTO chronos_schema_version (version, name) VALUES (%s, %s)", (m.version, m.name))
    applied = migrations.migrate(empty_database_url)
    assert applied == [m.version for m in migrations.migrations()[2:]]
    with psycopg.connect(empty_database_url) as conn:
        recorded = dict(conn.execute("SELECT version, compatible_from FROM chronos_schema_version").fetchall())
    assert [recorded[m.version] for m in first] == [None, None]


INDEX = """-- chronos: compatible from {latest}
-- chronos: outside a transaction
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS chronos_test_key ON chronos_messages (key);
"""


def test_a_migration_outside_a_transaction_builds_an_index_concurrently_and_resumes_an_interrupted_build(database_url):
    """The build is interrupted (here: duplicate keys make the unique build fail, which leaves the index
    invalid, as a killed `chronos migrate` does); IF NOT EXISTS alone would keep the invalid index. Once
    the cause is gone, the migration drops it and builds it again."""
    later = Migration.parse(LATEST + 1, "key_index", INDEX.format(latest=LATEST))
    assert later.outside_transaction and later.compatible_from == LATEST
    with psycopg.connect(database_url, autocommit=True) as conn:
        for mid in ("a", "b"):
            conn.execute("INSERT INTO chronos_messages (id, deadline, key) VALUES (%s, now(), 'same')", (mid,))
    with pytest.raises(Exception, match="could not create unique index"):
        migrations.migrate(database_url, migrations.migrations() + [later])
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = 'chronos_test_key'::regclass"
                            ).fetchone() == (False,)
        assert conn.execute("SELECT max(version) FROM chronos_schema_version").fetchone() == (LATEST,)
        conn.execute("DELETE FROM chronos_messages WHERE id = 'b'")
    assert migrations.migrate(database_url, migrations.migrations() + [later]) == [LATEST + 1]
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = 'chronos_test_key'::regclass"
                            ).fetchone() == (True,)
    check(database_url)  # this release runs on it: the migration is compatible from its version


def test_an_unknown_directive_is_refused():
    with pytest.raises(ValueError, match="unknown directive 'concurrently please'"):
        Migration.parse(99, "x", "-- chronos: concurrently please\nSELECT 1;")
    with pytest.raises(ValueError, match="a version after its own"):
        Migration.parse(9, "x", "-- chronos: compatible from 10\nSELECT 1;")
