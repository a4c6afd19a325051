"""Chronos on Debian's PostgreSQL 15, the oldest version it supports: the migrations, the plans of every
hot-path statement, and the core end-to-end tests (this directory's `pg_server` is PostgreSQL 15); an
older server is refused by `chronos migrate` and by the processes at start."""

from __future__ import annotations

import psycopg
import pytest
from test_core import collect  # noqa: F401  (the fixture the core tests below use)
from test_core import test_killed_firer_rows_are_fired_by_a_peer_after_the_hold_time  # noqa: F401
import test_core as core
import test_store_plans as plans
import test_firer_share_claims as share_claims

from chronos.adapters.postgres import connection, migrations
from chronos.errors import EXIT_SCHEMA, UnsupportedServer
from chronos.processes import Services
from chronos.runtime.process import Lifecycle, wait_for_schema
from helpers import settings


def test_the_server_is_postgresql_15(pg_server):
    with psycopg.connect(pg_server.url) as conn:
        assert conn.info.server_version // 10000 == 15


def test_the_migrations_build_the_schema_on_postgresql_15(empty_database_url):
    assert migrations.migrate(empty_database_url) == [m.version for m in migrations.migrations()]
    assert migrations.migrate(empty_database_url) == []
    with connection.connect(empty_database_url) as conn:
        migrations.check_schema(conn)


def test_a_server_older_than_the_oldest_supported_is_refused(monkeypatch, database_url, empty_database_url):
    """As if PostgreSQL 15 were too old: `chronos migrate` and a process's start say so (exit 4)."""
    monkeypatch.setattr(migrations, "MIN_SERVER_VERSION", 160000)
    with pytest.raises(UnsupportedServer, match=r"PostgreSQL 15\.\d+ is older than the oldest this chronos "
                                                r"supports \(16\): upgrade the server") as refused:
        migrations.migrate(empty_database_url)
    assert refused.value.exit_code == EXIT_SCHEMA
    with pytest.raises(UnsupportedServer):
        given = settings({"CHRONOS_DATABASE_URL": database_url})
        wait_for_schema(given, Lifecycle(), Services(given, "consumer"))
    with psycopg.connect(empty_database_url) as conn:  # nothing was created
        assert conn.execute("SELECT to_regclass('chronos_schema_version')").fetchone() == (None,)


# ten million rows are faked with pg_restore_relation_stats, which PostgreSQL 18 brought
@pytest.mark.parametrize("condition", [c for c in plans.CONDITIONS if c != "ten_million_rows"])
def test_every_hot_path_statement_reads_only_what_it_touches(database_url, condition):
    plans.test_every_hot_path_statement_reads_only_what_it_touches(database_url, condition)


@pytest.mark.parametrize("analyzed", ["with_its_rows", "before_the_due_rows"])
def test_a_claim_of_its_own_slices_fetches_only_its_own_rows_on_postgresql_15(database_url, analyzed):
    """The slice, the due index's last column, is read off the index entry on PostgreSQL 15 too."""
    share_claims.test_a_claim_of_its_own_slices_reads_only_its_own_due_rows(database_url, analyzed)


def test_mixed_delays_all_arrive_once_never_early(processes, broker, topics, collect):  # noqa: F811
    """The core test with the native codec (the codec does not meet PostgreSQL: one is enough here)."""
    core.test_mixed_delays_all_arrive_once_never_early(processes, broker, topics, collect, "native")
