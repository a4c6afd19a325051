"""The replicated PostgreSQL as Chronos sees it through its multi-host URL: commits that wait for the
synchronous standby. A killed or hung primary replaced and back as a standby, and a switchover, are tested
with Chronos running on the cluster (test_chronos_failover.py); the whole cluster down and back, by the
benchmark of every scenario (benchmarks/ha.py)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from helpers import wait_for

pytestmark = pytest.mark.slow

# a killed primary's node is replaced in about 20 s: Patroni 4's ttl is 20 s at least (docs/operations/postgresql-ha.md)
FAILOVER_S = 60


def _pg_port(cluster, name: str) -> int:
    return next(m.pg_port for m in cluster.members if m.name == name)


def _write(url: str, table: str, value: str) -> int:
    """Insert `value` through `url`; the port of the server that took it."""
    with psycopg.connect(url) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (v text PRIMARY KEY)")
        conn.execute(f"INSERT INTO {table} VALUES (%s)", (value,))
        return int(conn.info.port)


def _has(url: str, table: str, value: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT count(*) FROM {table} WHERE v = %s", (value,)).fetchone() == (1,)


def test_a_commit_waits_for_the_synchronous_standby(cluster):
    leader, standby = cluster.leader(), cluster.sync_standby()
    assert leader is not None and standby is not None and leader != standby
    with psycopg.connect(cluster.member_url(leader, admin=True)) as conn:
        states = conn.execute("SELECT application_name, sync_state FROM pg_stat_replication").fetchall()
    assert (standby, "sync") in states

    # applied on the standby by the time the commit returns (remote_apply: replayed, not only flushed)
    with psycopg.connect(cluster.url) as conn:
        assert conn.info.port == _pg_port(cluster, leader)
        conn.execute("CREATE TABLE IF NOT EXISTS sync_check (v text PRIMARY KEY)")
        conn.commit()
        conn.execute("SET synchronous_commit = remote_apply")
        conn.execute("INSERT INTO sync_check VALUES ('applied')")
        conn.commit()
    assert _has(cluster.member_url(standby), "sync_check", "applied")

    # with the standby hung, a commit (synchronous_commit on, the default) waits for it; it returns once
    # the standby runs again
    with psycopg.connect(cluster.url) as conn:
        conn.execute("INSERT INTO sync_check VALUES ('held')")
        backend = conn.info.backend_pid
        committed = threading.Event()

        def commit() -> None:
            conn.commit()
            committed.set()

        cluster.freeze(standby)
        try:
            thread = threading.Thread(target=commit, daemon=True)
            thread.start()
            with psycopg.connect(cluster.member_url(leader, admin=True), autocommit=True) as admin:
                wait_for(lambda: admin.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                               (backend,)).fetchone() == ("SyncRep",),
                         timeout=10, what="the commit waiting for the synchronous standby (wait_event SyncRep)")
            assert not committed.is_set()
        finally:
            cluster.thaw(standby)
        assert committed.wait(10), "the commit did not return once the standby ran again"
        thread.join(5)
    assert _has(cluster.member_url(standby), "sync_check", "held")
