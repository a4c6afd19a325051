"""Ordering keys, cancel/replace and recurring schedules in the store, against a real PostgreSQL."""

from __future__ import annotations

import random
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from chronos import codec

from chronos.domain import cron
from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store
from helpers import claim_plan


def now_us() -> int:
    return time.time_ns() // 1000


def r(mid, deadline_us, okey=None, value=b"v", **kw) -> Row:
    return Row(mid, deadline_us, None, b"k", value, b"", okey, kw.get("cron"), kw.get("timezone"))


def store(url) -> Store:
    return Store(url, node_id=uuid.uuid4())


def q(url, sql, *params):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


# -- ordering keys -------------------------------------------------------------------------------

def test_in_flight_row_holds_back_later_rows_of_its_key_only(database_url):
    a, b = store(database_url), store(database_url)
    t = now_us() - 1000
    a.insert([r("A1", t, "A"), r("A2", t, "A"), r("B1", t + 1, "B"), r("N1", t + 2)])
    first = a.claim(1, 0)
    assert [x.id for x in first] == ["A1"]
    assert [x.id for x in b.claim(10, 0)] == ["B1", "N1"]   # A2 waits for A1
    assert b.claim(10, 0) == []
    a.delete_fired(first)
    assert [x.id for x in b.claim(10, 0)] == ["A2"]


def test_a_chain_of_one_key_is_claimed_together_in_order(database_url):
    a, b = store(database_url), store(database_url)
    t = now_us() - 1000
    a.insert([r(f"A{i}", t, "A") for i in range(5)])
    got = a.claim(3, 0)
    assert [x.id for x in got] == ["A0", "A1", "A2"]
    assert b.claim(10, 0) == []  # A3 is behind rows a peer holds


def test_a_recurring_schedule_does_not_hold_back_its_key(database_url):
    s = store(database_url)
    t = now_us()
    s.insert([r("sched", t - 5_000_000, "A", cron="0 0 1 1 *"), r("A1", t - 1000, "A")])
    assert [x.id for x in s.claim(10, 0)] == ["A1"]


def test_competing_firers_publish_each_key_in_enqueue_order(database_url):
    keys = [f"key-{k}" for k in range(25)]
    t = now_us() - 1000
    rows = []
    for i in range(12):
        for k in keys:
            rows.append(r(f"{k}-{i}", t, k))        # equal deadlines: enqueue order decides
    store(database_url).insert(rows)
    published: list[str] = []
    in_flight: dict[str, str] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def firer():
        s = store(database_url)
        while True:
            got = s.claim(random.randint(1, 40), 0)
            if not got:
                with lock:
                    if len(published) == len(rows):
                        break
                time.sleep(0.001)
                continue
            with lock:
                for x in got:
                    key = x.id.rsplit("-", 1)[0]
                    holder = in_flight.setdefault(key, str(s.node_id))
                    if holder != str(s.node_id):
                        errors.append(f"{x.id} claimed while {holder} holds {key}")
                    published.append(x.id)
            time.sleep(random.random() / 500)
            with lock:  # released before the delete: a peer may claim the key's next row only after it
                for x in got:
                    in_flight.pop(x.id.rsplit("-", 1)[0], None)
            s.delete_fired(got)
        s.close()

    threads = [threading.Thread(target=firer) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    assert sorted(published) == sorted(x.id for x in rows)
    for k in keys:
        order = [int(p.rsplit("-", 1)[1]) for p in published if p.rsplit("-", 1)[0] == k]
        assert order == list(range(12)), (k, order)


def test_killed_firer_mid_batch_keeps_the_order_of_its_key(database_url):
    a, b = store(database_url), store(database_url)
    t = now_us() - 1000
    a.insert([r(f"A{i}", t, "A") for i in range(4)])
    assert [x.id for x in a.claim(2, 0)] == ["A0", "A1"]   # a dies holding A0, A1
    assert b.claim(10, 0) == []
    q(database_url, "UPDATE chronos_messages SET readied_at = NULL, readied_by = NULL")  # the detector's reset
    assert [x.id for x in b.claim(10, 0)] == ["A0", "A1", "A2", "A3"]


# -- cancel and replace ----------------------------------------------------------------------------

def test_apply_inserts_replaces_and_cancels_in_one_transaction(database_url):
    s = store(database_url)
    t = now_us() + 60_000_000
    s.insert([r("keep", t), r("old", t, value=b"old"), r("gone", t)])
    ins, rep, can, _ = s.apply([r("keep", t + 1), r("new", t)], [r("old", t + 5, value=b"new"), r("fresh", t)],
                            ["gone", "unknown"])
    assert (ins, rep, can) == (1, 2, 1)
    got = dict(q(database_url, "SELECT id, value FROM chronos_messages"))
    assert got == {"keep": b"v", "new": b"v", "old": b"new", "fresh": b"v"}


def test_replacing_a_row_a_firer_holds_hands_the_new_version_back(database_url):
    s = store(database_url)
    s.insert([r("x", now_us() - 1000, value=b"v1")])
    held = s.claim(1, 0)
    s.apply([], [r("x", now_us() - 500, value=b"v2")], [])
    assert s.delete_fired(held) == 0                      # the firer's delete leaves the new version
    (again,) = s.claim(1, 0)
    assert again.value == b"v2"


# -- recurring schedules ---------------------------------------------------------------------------

def schedule(url, sid, expr, deadline: datetime, tz=None, headers=None):
    store(url).insert([Row(sid, cron.to_us(deadline), None, b"k", b"tick", codec.encode_headers(headers or []),
                           None, expr, tz)])


def test_due_schedule_creates_one_claimed_occurrence_and_moves_on(database_url):
    now = datetime.now(timezone.utc)
    due = now.replace(second=0, microsecond=0)
    schedule(database_url, "tick", "* * * * *", due, headers=[("h", b"1")])
    s = store(database_url)
    assert s.claim(10, 0) == []                 # the schedule row itself is never claimed
    (occ,) = s.claim_schedules(10, 0, cron.to_us(now))
    stamp = due.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    assert occ.id == f"tick@{stamp}" and occ.deadline_us == cron.to_us(due)
    assert codec.decode_headers(occ.headers) == [("h", b"1"), ("chronosOccurrence", stamp.encode())]
    ((nxt,),) = q(database_url, "SELECT deadline FROM chronos_messages WHERE id = 'tick'")
    assert nxt == due + timedelta(minutes=1)
    assert s.claim_schedules(10, 0, cron.to_us(now)) == []
    assert s.delete_fired([occ]) == 1


def test_missed_occurrences_fire_once_the_latest(database_url):
    now = datetime.now(timezone.utc)
    three_hours_ago = (now - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    schedule(database_url, "ten", "*/10 * * * *", three_hours_ago)
    (occ,) = store(database_url).claim_schedules(10, 0, cron.to_us(now))
    latest = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0)
    assert occ.deadline_us == cron.to_us(latest)


def test_two_firers_never_create_the_same_occurrence_twice(database_url):
    now = datetime.now(timezone.utc)
    for i in range(50):
        schedule(database_url, f"s{i}", "* * * * *", now.replace(second=0, microsecond=0))
    got: list = []

    def firer():
        got.extend(store(database_url).claim_schedules(7, 0, cron.to_us(now)))

    threads = [threading.Thread(target=firer) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ids = [o.id for o in got]
    remaining = store(database_url).claim_schedules(100, 0, cron.to_us(now))
    ids += [o.id for o in remaining]
    assert len(ids) == 50 and len(set(ids)) == 50


def test_cancel_removes_a_schedule(database_url):
    schedule(database_url, "daily", "0 9 * * *", datetime.now(timezone.utc) + timedelta(hours=1))
    assert store(database_url).apply([], [], ["daily"]) == (0, 0, 1, 0)
    assert store(database_url).list_schedules() == []


@pytest.mark.parametrize("n", [1])
def test_far_future_rows_do_not_slow_the_claim_plan(database_url, n):
    """The claim uses the due index, so a store full of far-future rows costs it nothing."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline) SELECT 'f' || g, now() + interval '2 years' "
                     "FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE chronos_messages")
        plan = claim_plan(conn)
    assert "chronos_messages_due" in plan, plan
    # the deadline bound must be an index condition: as a filter, a claim that finds fewer rows
    # than its limit would read every far-future row
    assert "Index Cond: (deadline <=" in plan, plan


def test_deleting_fired_rows_goes_by_tid_even_under_a_generic_plan(database_url):
    """With statistics taken while nothing was in flight, a generic plan of a plain `=` join chose
    the in-flight index and looped over every in-flight row for every id (seconds per batch); the
    claimed rows are reached by the TID the claim returned."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline) SELECT 'f' || g, now() + interval '2 years' "
                     "FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE chronos_messages")
    s = store(database_url)
    s.insert([r(f"d{i}", now_us() - 1000) for i in range(3000)])
    held = s.claim(3000, 0)
    from chronos.adapters.postgres.store import QUERIES
    sql = (QUERIES["delete_fired"].replace("%(ctids)s", "$1").replace("%(ids)s", "$2")
           .replace("%(readied_at)s", "$3").replace("%(node)s", "$4"))
    with psycopg.connect(database_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE d(tid[], text[], timestamptz[], uuid) AS " + sql)
        plan = "\n".join(row[0] for row in conn.execute(
            "EXPLAIN EXECUTE d(%s::tid[], %s, %s, %s)",
            ([x.ctid for x in held[:1000]], [x.id for x in held[:1000]], [x.readied_at for x in held[:1000]],
             s.node_id)))
    assert "Tid Scan on chronos_messages" in plan, plan
    assert s.delete_fired(held[:1000]) == 1000
