"""The claim that deletes on a real PostgreSQL (chronos/adapters/postgres/takes.py): the server ends a held
transaction its firer left idle for the hold time, on a direct connection and through PgBouncer in
transaction mode; a row another firer took since the pick rolls the batch back within the lock timeout; a
row changed since the pick is left out with the rows of the batch that have an ordering key (put back with
the batch's commit); the firer's
sessions go by its own application name; a consumer's replace of a row held by a firer that hangs lands
once the server has ended that firer's transaction, no statement waiting on it longer than the lock timeout."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from chronos.adapters.postgres import pooling
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import LastSeq
from chronos.adapters.postgres.store import Store
from chronos.adapters.postgres.takes import TakeStatements
from chronos.domain.model import Mark, Row
from chronos.errors import ClaimContended, StoreUnavailable
from kits.pgbouncer import PgBouncer

OUT = "chronos.output"
PICKS = {QUERIES[name] for name in ("pick", "pick_recent", "pick_share", "pick_share_recent")}


def now_us() -> int:
    return time.time_ns() // 1000


def row(name: str, deadline_us: int, okey: str | None = None, value: bytes = b"v") -> Row:
    return Row(id=name, deadline_us=deadline_us, topic=None, key=b"k", value=value, headers=b"", ordering_key=okey)


def takes(url: str, held_ms: int, pool_mode: str = pooling.SESSION, **kw) -> TakeStatements:
    node = uuid.uuid4()
    return TakeStatements(url, node_id=node, hot_path=True, synchronous_commit=False, held_ms=held_ms,
                          application_name=kw.pop("application_name", f"chronos firer {node}"), pool_mode=pool_mode,
                          **kw)


def ids(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM chronos_messages ORDER BY id")]


def held_by_firers(url: str) -> list[str]:
    """The rows a firer holds, as the operators' commands find them."""
    store = Store(url)
    try:
        return sorted(i for i, held in store.present(ids(url)).items() if held)
    finally:
        store.close()


def wait_until(condition, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_held_transaction_its_firer_leaves_idle_for_the_hold_time_is_ended_by_the_server(database_url):
    """What keeps a dead, hung or cut-off firer's rows from staying held: no statement of its session is
    sent after the take, and the server ends the transaction (and the session) once the hold time is up."""
    Store(database_url).apply([row("a", now_us() - 1000), row("b", now_us() - 500)], [], [])
    t = takes(database_url, held_ms=800)
    assert [r.id for r in t.claim(10, 0)] == ["a", "b"]
    assert held_by_firers(database_url) == ["a", "b"]
    back_after = wait_until(lambda: not held_by_firers(database_url), 10, "the server to end the transaction")
    assert 0.5 < back_after < 3.0
    assert ids(database_url) == ["a", "b"]
    with pytest.raises(StoreUnavailable):
        t.finish([], [], [], OUT)
    assert ids(database_url) == ["a", "b"]   # nothing the firer did after the hold time counts


def test_through_pgbouncer_in_transaction_mode_the_held_transaction_is_ended_too(pg_server, database_url):
    with PgBouncer(pg_server.port, pooling.TRANSACTION) as bouncer:
        url = bouncer.url(database_url)
        Store(database_url).apply([row("a", now_us() - 1000)], [], [])
        t = takes(url, held_ms=800, pool_mode=pooling.TRANSACTION)
        assert [r.id for r in t.claim(10, 0)] == ["a"]
        assert held_by_firers(database_url) == ["a"]   # the firer's application name, through the pooler
        wait_until(lambda: not held_by_firers(database_url), 10, "the server to end the transaction")
        with pytest.raises(StoreUnavailable):
            t.finish([], [], [], OUT)
        # and a batch committed through the pooler is final
        t2 = takes(url, held_ms=5000, pool_mode=pooling.TRANSACTION)
        assert [r.id for r in t2.claim(10, 0)] == ["a"]
        t2.finish([], [], [], OUT)
        assert ids(database_url) == []
        t.close()
        t2.close()


def test_the_firer_s_sessions_go_by_its_own_name_whatever_the_url_says(database_url):
    """The rows a firer holds are found by its sessions' application name: one the URL gives is replaced."""
    Store(database_url).apply([row("a", now_us() - 1000)], [], [])
    t = takes(database_url + "?application_name=my-app", held_ms=60_000)
    t.claim(10, 0)
    assert held_by_firers(database_url) == ["a"]
    t.give_back()
    assert held_by_firers(database_url) == [] and ids(database_url) == ["a"]


def test_a_batch_committed_after_a_pick_s_snapshot_is_not_picked_again(database_url):
    """A statement's snapshot is taken as it starts: a firer's batch committed after that is still there to the
    pick, and must still count as held, or the pick chooses it again and its take finds none of it (a claim come
    back empty, the due rows behind it a poll interval late). So the held transactions are read first, in a
    statement of their own. Here the snapshot is a repeatable-read transaction's, taken while the peer held its
    batch, and the pick runs in it once the peer has committed."""
    base = now_us()
    Store(database_url).apply([row("a", base - 3000), row("b", base - 2000), row("c", base - 1000)], [], [])
    peer = takes(database_url, held_ms=60_000)
    assert [r.id for r in peer.claim(2, 0)] == ["a", "b"]
    with psycopg.connect(database_url, autocommit=True) as conn:
        held = conn.execute(QUERIES["held_xids"]).fetchone()[0]   # first, as TakeStatements reads it
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert conn.execute("SELECT count(*) FROM chronos_messages").fetchone()[0] == 3   # the snapshot: a, b held
        peer.finish([], [], [], OUT)   # committed: a and b are gone
        picked, ctids, _ = conn.execute(QUERIES["pick"], {"limit": 10, "lookahead_ms": 0, "held": held}).fetchone()
        assert conn.execute("SELECT array_agg(id)::text FROM chronos_messages WHERE ctid = ANY(%s::tid[])",
                            (ctids,)).fetchone()[0] == "{c}"
        assert picked == 1
        conn.execute("ROLLBACK")
    assert ids(database_url) == ["c"]


def test_a_claim_after_a_row_takes_the_rows_past_it_and_below_it_only_those_written_since(database_url):
    """A firer alone's claim starts past its last row (ClaimCursor): not at its own rows in flight. Below that mark
    it takes, within the window, only rows whose seq is past the last seq it was given (written since)."""
    base = now_us()
    Store(database_url).apply([row(name, base - 4000 + i) for i, name in enumerate("abcd")], [], [])
    first, second = takes(database_url, held_ms=60_000), takes(database_url, held_ms=60_000)
    since = first.last_seq()
    taken, whole = first.claim_whole(2, 0)
    assert [r.id for r in taken] == ["a", "b"] and whole
    Store(database_url).apply([row("late", base - 5000)], [], [])
    mark = Mark(taken[-1].deadline_us, taken[-1].seq)
    assert [r.id for r in second.claim(10, 0, 2000, mark)] == ["c", "d"]  # no seq given: nothing below the mark
    second.give_back()
    assert [r.id for r in second.claim(10, 0, 2000, mark._replace(since_seq=since))] == ["late", "c", "d"]
    second.give_back()
    later = second.last_seq()
    assert later == since + 1 and [r.id for r in second.claim(10, 0, 2000, mark._replace(since_seq=later))] == ["c", "d"]
    first.give_back()
    second.give_back()
    stamped = Store(database_url, node_id=uuid.uuid4())
    assert stamped.last_seq() == later
    rows, whole = stamped.claim_whole(10, 0, 2000, Mark(taken[0].deadline_us, taken[0].seq, since))
    assert [r.id for r in rows] == ["late", "b", "c", "d"] and not whole  # a stamp says whole only when full


def test_a_take_says_whether_it_took_every_row_it_chose(database_url):
    base = now_us()
    Store(database_url).apply([row("K-1", base - 3000, "K"), row("K-2", base - 2000, "K"), row("N", base - 1000)], [], [])
    first, second = takes(database_url, held_ms=60_000), takes(database_url, held_ms=60_000)
    assert [r.id for r in first.claim(1, 0)] == ["K-1"]
    rows, whole = second.claim_whole(10, 0)
    assert [r.id for r in rows] == ["N"] and not whole  # K-2 waits behind K-1, which the first session holds
    first.give_back()
    second.give_back()
    rows, whole = second.claim_whole(10, 0)
    assert [r.id for r in rows] == ["K-1", "K-2", "N"] and whole
    second.give_back()


def test_a_take_returns_each_row_as_written_its_times_made_once_a_take(database_url):
    """The take's rows are read in binary: every column as the stamping claim's text would have it, and each
    distinct time one datetime (the claim's for every row, the enqueue time for each consumer's batch)."""
    base = now_us()
    Store(database_url).apply([Row(id="a", deadline_us=base - 2000, topic="billing", key=b"\x00k", value=b"\xffv",
                                   headers=b"\x01h", ordering_key="K")], [], [])
    Store(database_url).apply([row("b", base - 1000), row("c", base - 500)], [], [])
    with psycopg.connect(database_url, autocommit=True) as conn:
        written = dict(conn.execute("SELECT id, enqueued_at FROM chronos_messages").fetchall())
    t = takes(database_url, held_ms=60_000)
    a, b, c = t.claim(10, 0)
    assert (a.id, a.deadline_us, a.topic, a.key, a.value, a.headers, a.ordering_key, a.seq > 0, a.attempts) == \
        ("a", base - 2000, "billing", b"\x00k", b"\xffv", b"\x01h", "K", True, 0)
    assert isinstance(a.ctid, str) and a.ctid.startswith("(")
    assert [r.enqueued_at for r in (a, b, c)] == [written["a"], written["b"], written["c"]]
    assert b.enqueued_at is c.enqueued_at and a.enqueued_at is not b.enqueued_at   # two writes: two times
    assert a.readied_at is b.readied_at is c.readied_at and a.readied_at.tzinfo is not None
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert abs((conn.execute("SELECT now()").fetchone()[0] - a.readied_at).total_seconds()) < 5
    t.give_back()


def test_a_role_that_may_not_read_the_last_seq_claims_without_it_and_says_so(database_url, caplog):
    """An install that revoked EXECUTE from PUBLIC: the firer's claims start past their last row only after one
    that came back full, and it says once what to grant."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        url = make_conninfo(database_url, user=role)
        assert Store(url).last_seq() == 0 and takes(url, 60_000).last_seq() == 0  # PUBLIC's by default
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION chronos_last_seq() FROM PUBLIC")
        store, session = Store(url), takes(url, 60_000)
        LastSeq.last_seq_told = False
        with caplog.at_level(logging.WARNING, logger="chronos.store"):
            assert store.last_seq() is None and store.last_seq() is None and session.last_seq() is None
        assert sum("GRANT EXECUTE ON FUNCTION chronos_last_seq()" in r.getMessage() for r in caplog.records) == 1
        store.close()
        session.close()
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("GRANT EXECUTE ON FUNCTION chronos_last_seq() TO PUBLIC")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


class Meddled(TakeStatements):
    """A session that lets `meddle` run between its pick and its take: what another client does meanwhile."""

    meddle = staticmethod(lambda: None)

    def _execute(self, conn, query, params=None, *, prepare=None, binary=False):
        cur = super()._execute(conn, query, params, prepare=prepare, binary=binary)
        if query in PICKS:
            self.meddle()
        return cur


def test_a_row_another_firer_took_since_the_pick_rolls_the_batch_back_within_the_lock_timeout(database_url):
    Store(database_url).apply([row("a", now_us() - 1000), row("b", now_us() - 500)], [], [])
    node = uuid.uuid4()
    t = Meddled(database_url, node_id=node, held_ms=60_000, application_name=f"chronos firer {node}")
    peer = takes(database_url, held_ms=60_000)
    t.meddle = lambda: peer.claim(1, 0)   # the peer takes a: held in its transaction
    started = time.monotonic()
    with pytest.raises(ClaimContended):
        t.claim(10, 0)
    assert time.monotonic() - started < 2.0
    assert not t.holding and held_by_firers(database_url) == ["a"]   # b is not held: the batch rolled back
    peer.give_back()


def test_a_row_changed_since_the_pick_is_left_out_with_the_rows_that_have_a_key(database_url):
    store, base = Store(database_url, node_id=uuid.uuid4()), now_us()
    store.apply([row("K-1", base - 3000, "K"), row("K-2", base - 2000, "K"), row("N", base - 1000)], [], [])
    node = uuid.uuid4()
    t = Meddled(database_url, node_id=node, held_ms=60_000, application_name=f"chronos firer {node}")
    t.meddle = lambda: Store(database_url).apply([], [row("K-1", base - 3000, "K", b"v2")], [])  # a replace
    assert [r.id for r in t.claim(10, 0)] == ["N"]
    assert held_by_firers(database_url) == ["K-2", "N"]   # K-2 put back in the batch: back with its commit
    t.finish([], [], [], OUT)
    assert ids(database_url) == ["K-1", "K-2"]
    [first] = store.claim(1, 0)
    assert (first.id, first.value) == ("K-1", b"v2")   # the key's order stands


def test_a_replace_of_a_row_a_hung_firer_holds_lands_once_the_server_ended_its_transaction(database_url):
    """The consumer's write never waits on the row longer than its lock timeout (200 ms here): it is tried
    again until the hung firer's transaction is over, then the new version is stored, and fires."""
    consumer = Store(database_url, node_id=uuid.uuid4(), lock_timeout_ms=200, lock_wait_s=10.0)
    consumer.apply([row("x", now_us() - 1000, value=b"v1")], [], [])
    hung = takes(database_url, held_ms=1500)
    hung.claim(10, 0)
    waits: list[float] = []
    with psycopg.connect(database_url, autocommit=True) as watcher:
        done = threading.Event()

        def watch() -> None:   # the longest any statement of the consumer waited for a lock, as it waits
            while not done.is_set():
                (longest,) = watcher.execute(
                    "SELECT coalesce(max(extract(epoch FROM now() - query_start)), 0) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND application_name = 'chronos'").fetchone()
                waits.append(float(longest))
                time.sleep(0.02)
        watching = threading.Thread(target=watch)
        watching.start()
        started = time.monotonic()
        assert consumer.apply([], [row("x", now_us() - 500, value=b"v2")], []) == (0, 1, 0, 0)
        took = time.monotonic() - started
        done.set()
        watching.join()
    assert 1.0 < took < 4.0
    assert max(waits) < 0.5
    [again] = Store(database_url, node_id=uuid.uuid4()).claim(10, 0)
    assert (again.id, again.value) == ("x", b"v2")
