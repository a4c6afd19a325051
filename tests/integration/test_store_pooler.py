"""The store behind a connection pooler (Debian's PgBouncer: kits/pgbouncer.py), in session and in
transaction mode: the processes' statements work, nothing of a store stays on a server connection the
pooler lends to others, a connection dropped mid-transaction leaves nothing done, the probe tells the modes
apart, and a store in session mode behind a pooler in transaction mode stops with the setting to change."""

from __future__ import annotations

import contextlib
import time
import uuid

import psycopg
import pytest

from chronos.adapters.postgres import pooling, session
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Row
from chronos.errors import ConfigError, PoolModeMismatch, StoreUnavailable
from kits.pgbouncer import PgBouncer

# What a server connection holds when nothing of a client stayed on it: the settings as the server has
# them, no staging table, no prepared statement.
CLEAN_STATE = ("SELECT pg_backend_pid(), current_setting('enable_seqscan'), current_setting('enable_bitmapscan'), "
               "current_setting('jit'), current_setting('synchronous_commit'), "
               "current_setting('max_parallel_workers_per_gather'), to_regclass('pg_temp.chronos_staging') IS NULL, "
               "(SELECT count(*) FROM pg_prepared_statements)")


def now_us() -> int:
    return time.time_ns() // 1000


def row(name: str, deadline_us: int, value: bytes = b"v") -> Row:
    return Row(id=name, deadline_us=deadline_us, topic=None, key=b"k", value=value, headers=b"")


@pytest.fixture(scope="module", params=[pooling.SESSION, pooling.TRANSACTION])
def pooler(request, pg_server):
    """PgBouncer in front of the session's PostgreSQL, in each mode."""
    with PgBouncer(pg_server.port, request.param) as bouncer:
        yield bouncer


@pytest.fixture
def transaction_pooler(pg_server):
    """PgBouncer in transaction mode that lends its idle server connections in turn (server_round_robin),
    with four of them open: consecutive transactions of one client always land on different ones, so what
    a client left on one connection is missing from the next."""
    with PgBouncer(pg_server.port, pooling.TRANSACTION, server_round_robin="1") as bouncer:
        yield bouncer


def warm(url: str, servers: int = 4) -> None:
    """Make the pooler open `servers` server connections for `url`'s database (each client holds one in its
    transaction at once)."""
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(psycopg.connect(url, autocommit=True, prepare_threshold=None))
                 for _ in range(servers)]
        for conn in conns:
            conn.execute("BEGIN")
            conn.execute("SELECT 1")
        for conn in conns:
            conn.execute("COMMIT")


def role_stores(url: str, mode: str) -> tuple[Store, Store, Store]:
    """A consumer's, a firer's and a detector's store, as the processes make them (chronos.roles)."""
    return (Store(url, node_id=uuid.uuid4(), hot_path=True, pool_mode=mode),
            Store(url, node_id=uuid.uuid4(), hot_path=True, synchronous_commit=False, pool_mode=mode),
            Store(url, node_id=uuid.uuid4(), hot_path=True, pool_mode=mode))


def server_states(bouncer: PgBouncer, url: str) -> list[tuple]:
    """CLEAN_STATE of every server connection the pooler holds to `url`'s database: one client per server
    connection, each holding it in a transaction while it asks."""
    pids = bouncer.server_pids(url.rpartition("/")[2])
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(psycopg.connect(url, autocommit=True, prepare_threshold=None))
                 for _ in range(max(1, len(pids)))]
        states = []
        for conn in conns:
            conn.execute("BEGIN")
            states.append(conn.execute(CLEAN_STATE).fetchone())
        for conn in conns:
            conn.execute("COMMIT")
    assert pids <= {state[0] for state in states}, "a server connection was not looked at"
    return states


def exercise(bouncer: PgBouncer, database_url: str) -> None:
    """Every hot-path statement of the three processes through `bouncer`, in its mode; then nothing of them
    on any server connection. The test database's default synchronous_commit is on (the test server's is
    off), so that a firer's setting left behind would show."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {database_url.rpartition('/')[2]} SET synchronous_commit = on")
    url = bouncer.url(database_url)
    consumer, firer, detector = role_stores(url, bouncer.pool_mode)
    due, later = now_us() - 1_000_000, now_us() + 3_600_000_000
    try:
        # new ids (one COPY), then a batch read again (the staging table) with a replace and a cancel
        assert consumer.apply([row("a", due), row("b", due), row("c", later)], [], []) == (3, 0, 0, 0)
        assert consumer.apply([row("a", due), row("d", due)], [row("c", due, b"new")], ["b"]) == (1, 1, 1, 0)
        assert consumer.apply([], [row("e", due)], []) == (0, 1, 0, 0)
        assert consumer.waiting_ids(["a", "b", "c"]) == {"a", "c"}

        claimed = firer.claim(100, 0)
        assert sorted(r.id for r in claimed) == ["a", "c", "d", "e"]
        assert {r.id: r.value for r in claimed}["c"] == b"new"
        assert firer.delete_fired([r for r in claimed if r.id in ("a", "c")]) == 2

        time.sleep(0.05)
        stale = detector.find_stale(10)
        assert sorted(s.id for s in stale) == ["d", "e"]
        assert detector.reset_stale(stale) == [firer.node_id, firer.node_id]
        overview = detector.overview(10)
        assert (overview.waiting, overview.due, overview.in_flight) == (2, 2, 0)
        assert firer.db_clock_us() > 0

        # the hot path's settings, in either mode (through a pooler in transaction mode in each transaction, and
        # in it only): no parallel workers either
        seen = firer._run(lambda c: firer._execute(c, "SELECT current_setting('enable_seqscan'), "
                                                     "current_setting('jit'), current_setting('synchronous_commit'), "
                                                     "current_setting('max_parallel_workers_per_gather')").fetchone())
        assert seen == ("off", "off", "off", "0")
    finally:
        for s in (consumer, firer, detector):
            s.close()
    states = server_states(bouncer, url)
    assert states and all(state[1:] == ("on", "on", "on", "on", "2", True, 0) for state in states), states


def test_the_processes_statements_work_through_the_pooler_and_leave_nothing_behind(pooler, database_url):
    exercise(pooler, database_url)


def test_where_libpq_has_no_pipeline_mode_the_settings_go_in_an_explicit_transaction(monkeypatch, pg_server,
                                                                                     database_url):
    monkeypatch.setattr(session, "PIPELINE", False)
    with PgBouncer(pg_server.port, pooling.TRANSACTION) as bouncer:
        exercise(bouncer, database_url)


def test_a_connection_dropped_in_a_transaction_leaves_nothing_done(pooler, database_url):
    """A consumer batch whose replace waits on a row lock past the store's deadline: the connection is
    dropped mid-transaction, the pooler closes its server connection, and once the lock is gone nothing of
    the batch is there. The next call works on a new connection."""
    url = pooler.url(database_url)
    consumer = Store(url, node_id=uuid.uuid4(), hot_path=True, pool_mode=pooler.pool_mode, deadline_s=0.5)
    later = now_us() + 3_600_000_000
    try:
        consumer.insert([row("held", later), row("kept", later)])
        with psycopg.connect(database_url, autocommit=True) as locker:
            with locker.transaction():
                locker.execute("SELECT FROM chronos_messages WHERE id = 'held' FOR UPDATE")
                with pytest.raises(StoreUnavailable, match="did not answer within 0.5s"):
                    consumer.apply([row("new", later)], [row("held", later, b"replaced")], ["kept"])
            deadline = time.monotonic() + 10
            busy = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() " \
                   "AND backend_type = 'client backend' AND state <> 'idle'"
            while locker.execute(busy).fetchone()[0] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert locker.execute("SELECT id, value FROM chronos_messages ORDER BY id").fetchall() == [
                ("held", b"v"), ("kept", b"v")]
        assert consumer.apply([row("new", later)], [row("held", later, b"replaced")], ["kept"]) == (1, 1, 1, 0)
    finally:
        consumer.close()


def test_the_probe_tells_the_modes_apart(pooler, database_url):
    assert pooling.detect_pool_mode(database_url) == pooling.SESSION  # no pooler
    assert pooling.detect_pool_mode(pooler.url(database_url)) == pooler.pool_mode
    assert pooling.resolve_pool_mode(pooler.url(database_url), pooling.AUTO) == pooler.pool_mode


def test_the_probe_finds_a_pooler_that_lends_its_connections_in_turn(transaction_pooler, database_url):
    url = transaction_pooler.url(database_url)
    warm(url)
    assert pooling.detect_pool_mode(url) == pooling.TRANSACTION


def test_session_mode_is_refused_at_start_behind_a_pooler_in_transaction_mode(transaction_pooler, database_url):
    url = transaction_pooler.url(database_url)
    with pytest.raises(PoolModeMismatch, match="CHRONOS_DATABASE_POOL_MODE=session, but PostgreSQL at .* is reached "
                                               "through a pooler in transaction mode .*: set "
                                               "CHRONOS_DATABASE_POOL_MODE=transaction or auto"):
        pooling.resolve_pool_mode(url, pooling.SESSION, check=True)
    assert pooling.resolve_pool_mode(url, pooling.SESSION) == pooling.SESSION  # trusted without the check


def test_a_pooler_in_statement_mode_is_refused(pg_server, database_url):
    with PgBouncer(pg_server.port, "statement") as bouncer:
        with pytest.raises(ConfigError, match="a pooler in statement mode, which allows no transaction"):
            pooling.detect_pool_mode(bouncer.url(database_url))


def test_a_store_in_session_mode_behind_a_pooler_in_transaction_mode_stops_with_the_setting(
        transaction_pooler, database_url):
    """What vanishes between two statements (a prepared claim, the staging table) is a configuration
    error naming the setting: never a StoreUnavailable to retry forever, nor a StoreRejected that would
    dead-letter the batch row by row."""
    url = transaction_pooler.url(database_url)
    warm(url)
    later = now_us() + 3_600_000_000
    consumer, firer, _ = role_stores(url, pooling.SESSION)
    try:
        consumer.insert([row("a", later)])
        with pytest.raises(PoolModeMismatch, match="the connection's staging table is gone.*"
                                                   "set CHRONOS_DATABASE_POOL_MODE=transaction"):
            consumer.apply([], [row("a", later, b"replaced")], [])
        with pytest.raises(PoolModeMismatch, match="a statement prepared on the connection is not there"):
            firer.claim(10, 0)
    finally:
        consumer.close()
        firer.close()


def test_a_store_in_auto_mode_probes_once_and_works(transaction_pooler, database_url):
    url = transaction_pooler.url(database_url)
    warm(url)
    auto = Store(url, node_id=uuid.uuid4(), hot_path=True, synchronous_commit=False, pool_mode=pooling.AUTO)
    try:
        assert auto.claim(10, 0) == [] and auto.claim(10, 0) == []
        assert auto.pool_mode == pooling.TRANSACTION
    finally:
        auto.close()


def test_key_search_refuses_a_pooler_in_transaction_mode_and_leaves_no_lock_behind(transaction_pooler, database_url):
    """`chronos key-search` holds chronos migrate's session lock across statements, which a pooler in transaction
    mode would leave on a server connection it lends to others: it refuses, naming what to give it instead."""
    import os
    import subprocess
    import sys
    url = transaction_pooler.url(database_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")}
    done = subprocess.run([sys.executable, "-m", "chronos", "key-search", "on"], capture_output=True, text=True,
                          env={**env, "CHRONOS_DATABASE_URL": url}, timeout=60)
    assert done.returncode == 2 and "pooler in transaction mode: chronos key-search needs a session of its own" \
        in done.stderr, done.stderr
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0
        assert conn.execute("SELECT to_regclass('chronos_messages_key_hash')").fetchone()[0] is None
