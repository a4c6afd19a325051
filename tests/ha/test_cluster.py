"""The replicated PostgreSQL as Chronos sees it through its multi-host URL: commits that wait for the
synchronous standby, a killed or hung primary replaced and back as a standby, a switchover, the whole
cluster down and up again."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from helpers import wait_for

pytestmark = pytest.mark.slow

FAILOVER_S = 60  # BROKER.md: a killed primary's node is replaced in about 20 s (Patroni's ttl)


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


def test_a_killed_leader_is_replaced_and_rejoins_as_synchronous_standby(cluster):
    old, standby = cluster.leader(), cluster.sync_standby()
    _write(cluster.url, "failover_check", "before")

    killed_at = time.time()
    cluster.kill(old)
    new = cluster.wait_leader(not_name=old, timeout=FAILOVER_S)
    print(f"\nkill of leader {old} -> {new.name} leads after {new.at - killed_at:.1f}s")
    assert new.name == standby  # in synchronous mode only the synchronous standby may take over

    # the multi-host URL skips the dead member and reaches the new leader, which holds every commit
    assert _write(cluster.url, "failover_check", "after") == _pg_port(cluster, new.name)
    assert _has(cluster.url, "failover_check", "before")

    restarted_at = time.time()
    cluster.restart(old)
    assert cluster.wait_sync_standby(timeout=60) == old
    print(f"{old} rejoined as synchronous standby {time.time() - restarted_at:.1f}s after its restart")
    wait_for(lambda: _has(cluster.member_url(old), "failover_check", "after"), timeout=10,
             what=f"the write made while {old} was down, on {old}")


def test_a_hung_leader_is_replaced_and_rejoins_once_it_runs_again(cluster):
    old, standby = cluster.leader(), cluster.sync_standby()
    frozen_at = time.time()
    cluster.freeze(old)
    try:
        new = cluster.wait_leader(not_name=old, timeout=FAILOVER_S)
        print(f"\nfreeze of leader {old} -> {new.name} leads after {new.at - frozen_at:.1f}s")
        assert new.name == standby
        # the hung member still accepts TCP connections and never answers: the URL's connect_timeout
        # moves libpq on to the next host
        assert _write(cluster.url, "freeze_check", "while hung") == _pg_port(cluster, new.name)
    finally:
        cluster.thaw(old)
    assert cluster.wait_sync_standby(timeout=60) == old  # demoted, rewound, streaming


def test_a_switchover_moves_the_leader(cluster):
    old, standby = cluster.leader(), cluster.sync_standby()
    asked_at = time.time()
    new = cluster.switchover()
    print(f"\nswitchover {old} -> {new.name} in {new.at - asked_at:.1f}s")
    assert new.name == standby
    assert cluster.wait_sync_standby(timeout=60) == old
    assert _write(cluster.url, "switchover_check", "after") == _pg_port(cluster, new.name)


def test_the_whole_cluster_down_and_back_keeps_its_data(cluster):
    _write(cluster.url, "restart_check", "kept")
    cluster.stop_all()
    assert all(m.patroni_pid is None and m.postmaster_pid is None for m in cluster.members)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(cluster.url).close()
    cluster.start_all(timeout=60)
    assert _has(cluster.url, "restart_check", "kept")
