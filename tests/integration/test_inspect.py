"""Operators' queries and actions (chronos/ops/inspect.py) against a real PostgreSQL: every new SQL path,
what actions do to in-flight rows, and the plans of the list filters on a 10-million-row table."""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from chronos import codec

from chronos.ops import inspect
from chronos.ops.inspect import Filters
from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store

OUT = "chronos.output"
WEIRD = ["it's", 'say "hi"', "back\\slash", "100%", "%(x)s", "naïve-日本-🚀", "under_score", "a,b", "{x}"]


def now_us() -> int:
    return time.time_ns() // 1000


def r(mid: str, deadline_us: int, **kw) -> Row:
    return Row(mid, deadline_us, kw.get("topic"), kw.get("key", b"k"), kw.get("value", b"v"),
               codec.encode_headers(kw.get("headers", [])), kw.get("ordering_key"), kw.get("cron"),
               kw.get("timezone"))


@pytest.fixture
def s(database_url):
    st = Store(database_url, node_id=uuid.uuid4())
    yield st
    st.close()


def ids(page) -> list[str]:
    return [m.id for m in page.items]


def walk(s, f: Filters, limit: int) -> list[str]:
    got, after = [], None
    while True:
        page = inspect.list_messages(s, f, output_topic=OUT, limit=limit, after=after)
        got += ids(page)
        if page.cursor is None:
            return got
        after = page.cursor


# -- show ----------------------------------------------------------------------------------------

def test_show_each_state_and_not_found(s):
    t = now_us() + 3_600_000_000
    s.insert([r("w", t, key=b"\xff\x00", value=b"x" * 100, headers=[("trace", b"abc"), ("bin", b"\x01")],
                ordering_key="ok"),
              r("f", now_us() - 1000, topic="elsewhere", value=None),
              r("c", t, cron="0 9 * * *", timezone="Europe/Paris")])
    s.claim(10, 0)
    w = inspect.show(s, "w", output_topic=OUT)
    assert (w.state, w.topic, w.key, w.value_size, w.ordering_key) == ("waiting", OUT, b"\xff\x00", 100, "ok")
    assert w.headers == [("trace", b"abc"), ("bin", b"\x01")] and w.value_preview == b"x" * 64
    f = inspect.show(s, "f", output_topic=OUT)
    assert (f.state, f.topic, f.value_size, f.firer) == ("in_flight", "elsewhere", None, s.node_id)
    assert f.claimed_at is not None
    c = inspect.show(s, "c", output_topic=OUT)
    assert (c.state, c.cron, c.timezone) == ("recurring", "0 9 * * *", "Europe/Paris")
    assert inspect.show(s, "nope", output_topic=OUT) is None
    assert inspect.to_json(None) == {"state": "not_found"}
    assert inspect.to_json(w)["key"] == {"text": None, "hex": "ff00"} and inspect.to_json(w)["value_truncated"]


def test_weird_ids_work_in_show_list_and_every_action(s):
    t = now_us() + 3_600_000_000
    s.insert([r(i, t + n) for n, i in enumerate(WEIRD)])
    for i in WEIRD:
        assert inspect.show(s, i, output_topic=OUT).id == i
    # a prefix holding LIKE's wildcards matches them literally
    assert ids(inspect.list_messages(s, Filters(id_prefix="100%"), output_topic=OUT)) == ["100%"]
    assert ids(inspect.list_messages(s, Filters(id_prefix="under_"), output_topic=OUT)) == ["under_score"]
    assert ids(inspect.list_messages(s, Filters(id_prefix="%"), output_topic=OUT)) == ["%(x)s"]
    assert ids(inspect.list_messages(s, Filters(id_prefix="naïve-日"), output_topic=OUT)) == ["naïve-日本-🚀"]
    later = datetime.now(timezone.utc) + timedelta(days=1)
    assert inspect.act(s, "reschedule", ids=WEIRD[:3], output_topic=OUT, at=later).changed == 3
    assert inspect.act(s, "fire_now", ids=WEIRD[3:6], output_topic=OUT).changed == 3
    assert inspect.act(s, "cancel", ids=WEIRD, output_topic=OUT).changed == len(WEIRD)
    assert inspect.list_messages(s, Filters(), output_topic=OUT).items == []


# -- list ----------------------------------------------------------------------------------------

def test_list_filters_and_keyset_paging(s):
    base = now_us() + 60_000_000
    rows = [r(f"m{i:03d}", base + i * 1_000_000, key=b"even" if i % 2 == 0 else b"odd",
              topic="t.other" if i % 5 == 0 else None, ordering_key="o" if i % 7 == 0 else None)
            for i in range(40)]
    s.insert(rows + [r("sched", base + 10_500_000, cron="*/5 * * * *")])
    s.insert([r("inflight", now_us() - 1000)])
    s.claim(10, 0)
    everything = walk(s, Filters(), 7)
    assert everything == ["inflight"] + [f"m{i:03d}" for i in range(11)] + ["sched"] + \
        [f"m{i:03d}" for i in range(11, 40)]
    assert walk(s, Filters(state="waiting"), 6) == [f"m{i:03d}" for i in range(40)]
    assert walk(s, Filters(state="in_flight"), 6) == ["inflight"]
    assert walk(s, Filters(state="recurring"), 6) == ["sched"]
    assert walk(s, Filters(key=b"odd"), 4) == [f"m{i:03d}" for i in range(1, 40, 2)]
    assert walk(s, Filters(topic="t.other"), 3) == [f"m{i:03d}" for i in range(0, 40, 5)]
    assert len(walk(s, Filters(output_topic=True, state="waiting"), 9)) == 32
    assert walk(s, Filters(ordering_key="o"), 2) == [f"m{i:03d}" for i in range(0, 40, 7)]
    after = datetime.fromtimestamp((base + 9_500_000) / 1e6, timezone.utc)
    before = datetime.fromtimestamp((base + 12_500_000) / 1e6, timezone.utc)
    assert walk(s, Filters(due_after=after, due_before=before), 2) == ["m010", "sched", "m011", "m012"]
    assert walk(s, Filters(id_prefix="m01"), 3) == [f"m{i:03d}" for i in range(10, 20)]
    assert walk(s, Filters(id_prefix="m00", key=b"even", state="waiting"), 2) == [f"m{i:03d}" for i in range(0, 10, 2)]


def test_list_refuses_a_foreign_cursor_and_bad_limits(s):
    with pytest.raises(inspect.ConfigError, match="cursor"):
        inspect.list_messages(s, Filters(), output_topic=OUT, after="not-a-cursor")
    cursor = inspect.encode_cursor("d", [1, 2])
    with pytest.raises(inspect.ConfigError, match="other filters"):
        inspect.list_messages(s, Filters(id_prefix="x"), output_topic=OUT, after=cursor)
    with pytest.raises(inspect.ConfigError, match="limit"):
        inspect.list_messages(s, Filters(), output_topic=OUT, limit=0)


# -- actions -------------------------------------------------------------------------------------

def deadline_of(url: str, mid: str) -> datetime | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT deadline FROM chronos_messages WHERE id = %s", (mid,)).fetchone()
    return row[0] if row else None


def totals(s) -> dict:
    return inspect.action_totals(s)


def test_actions_by_id_report_unknown_ids_and_count_themselves(s, database_url):
    t = now_us() + 3_600_000_000
    s.insert([r(f"a{i}", t) for i in range(5)] + [r("sched", t, cron="0 9 * * *")])
    res = inspect.act(s, "fire_now", ids=["a0", "a1", "ghost"], output_topic=OUT)
    assert (res.changed, res.not_found) == (2, ["ghost"])
    with pytest.raises(inspect.NotFound):
        res.check()
    assert deadline_of(database_url, "a0") <= res.at <= datetime.now(timezone.utc)
    later = datetime(2031, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
    assert inspect.act(s, "reschedule", ids=["a2", "sched"], output_topic=OUT, at=later).changed == 2
    assert deadline_of(database_url, "a2") == later == deadline_of(database_url, "sched")
    assert inspect.act(s, "cancel", ids=["a3", "sched"], output_topic=OUT).changed == 2
    assert deadline_of(database_url, "sched") is None
    assert totals(s) == {"cancel": (1, 2), "fire_now": (1, 2), "reschedule": (1, 2)}
    # a dry run changes and counts nothing
    assert inspect.act(s, "cancel", ids=["a4"], output_topic=OUT, dry_run=True).changed == 1
    assert deadline_of(database_url, "a4") is not None and totals(s)["cancel"] == (1, 2)


def test_filtered_actions_work_in_batches_and_need_yes_above_the_threshold(s, database_url):
    t = now_us() + 3_600_000_000
    s.insert([r(f"b{i:03d}", t + i, key=b"x") for i in range(25)] + [r("other", t, key=b"y")])
    f = Filters(key=b"x")
    with pytest.raises(inspect.NeedsConfirmation):
        inspect.act(s, "cancel", filters=f, output_topic=OUT, confirm_above=10, batch=4)
    assert len(walk(s, f, 100)) == 25, "nothing changed before the refusal"
    dry = inspect.act(s, "cancel", filters=f, output_topic=OUT, dry_run=True, confirm_above=10, batch=4)
    assert dry.changed == 25 and dry.sample == [f"b{i:03d}" for i in range(20)]
    res = inspect.act(s, "cancel", filters=f, output_topic=OUT, confirm_above=10, yes=True, batch=4)
    assert res.changed == 25 and walk(s, Filters(), 100) == ["other"]
    assert totals(s)["cancel"] == (1, 25)


def test_a_filtered_reschedule_into_the_walked_range_changes_each_row_once(s, database_url):
    t = now_us() + 3_600_000_000
    s.insert([r(f"c{i:03d}", t + i * 1000) for i in range(30)])
    # the new deadline lies in the middle of the rows walked: moved rows must not come round again
    middle = datetime.fromtimestamp((t + 15_000 + 500) / 1e6, timezone.utc)
    res = inspect.act(s, "reschedule", filters=Filters(state="waiting"), output_topic=OUT, at=middle, batch=4)
    assert res.changed == 30 and totals(s)["reschedule"] == (1, 30)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(DISTINCT deadline) FROM chronos_messages").fetchone()[0] == 1
    res = inspect.act(s, "fire_now", filters=Filters(state="waiting"), output_topic=OUT, batch=4)
    assert res.changed == 30 and walk(s, Filters(due_before=datetime.now(timezone.utc)), 100) != []


# -- in-flight rows --------------------------------------------------------------------------------

@pytest.mark.parametrize("action", ["cancel", "fire_now", "reschedule"])
def test_in_flight_rows_are_left_alone_and_still_fire_at_their_claimed_deadline(s, database_url, action):
    """A firer claimed the row (within its lookahead) and publishes it from memory at the deadline it
    claimed it with. The action must neither lose it (cancel would delete the row the firer still has to
    publish and acknowledge), nor make it fire early, nor fire it twice."""
    deadline = now_us() + 200_000
    s.insert([r("held", deadline), r("free", deadline + 3_600_000_000)])
    claimed = s.claim(10, 1000)
    assert [c.id for c in claimed] == ["held"]
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    by_id = inspect.act(s, action, ids=["held", "free"], output_topic=OUT, at=later)
    assert by_id.in_flight == ["held"] and by_id.changed == 1
    with pytest.raises(inspect.InFlightSkipped):
        by_id.check()
    by_filter = inspect.act(s, action, filters=Filters(), output_topic=OUT, at=later)
    assert by_filter.in_flight == ["held"]
    # the row is as claimed: its deadline, and owned by the firer, which deletes it after publishing
    assert inspect.show(s, "held", output_topic=OUT).deadline == claimed[0].readied_at.__class__.fromtimestamp(
        deadline / 1e6, timezone.utc)
    # a later input message with the same id while it is in flight: ignored (the id is taken)
    assert s.insert([r("held", deadline + 10_000_000, value=b"second")]) == 0
    assert s.delete_fired(claimed) == 1
    # once it fired, the id is free: the same id schedules anew
    assert s.insert([r("held", deadline + 10_000_000, value=b"second")]) == 1


def test_a_claim_racing_an_action_wins_or_loses_whole(s, database_url):
    """The action's UPDATE/DELETE re-reads a row a concurrent claim locked: it then sees it claimed and
    leaves it; the firer never finds its row changed under it."""
    s.insert([r("race", now_us() - 1000)])
    with psycopg.connect(database_url) as conn:  # a firer's claim, not yet committed
        conn.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = gen_random_uuid() "
                     "WHERE id = 'race'")
        import threading
        out = {}
        t = threading.Thread(target=lambda: out.update(res=inspect.act(Store(database_url), "cancel", ids=["race"],
                                                                         output_topic=OUT)))
        t.start()
        time.sleep(0.3)  # the action is blocked on the claim's row lock: it cannot finish before the commit
        assert t.is_alive()
        conn.commit()
        t.join(10)
    res = out["res"]
    assert res.changed == 0 and res.in_flight == ["race"]
    assert deadline_of(database_url, "race") is not None


def test_after_cancel_a_later_message_with_the_same_id_schedules_anew(s):
    t = now_us() + 3_600_000_000
    s.insert([r("again", t)])
    assert inspect.act(s, "cancel", ids=["again"], output_topic=OUT).changed == 1
    assert s.insert([r("again", t + 1, value=b"new")]) == 1
    # after fire-now or reschedule the id is still waiting: a plain message with it is ignored
    assert inspect.act(s, "fire_now", ids=["again"], output_topic=OUT).changed == 1
    assert s.insert([r("again", t + 2, value=b"third")]) == 0


# -- plans with 10 million rows --------------------------------------------------------------------

FAKE_ROWS = 10_000_000


def forge_statistics(conn) -> None:
    """Tell the planner the table holds 10 million waiting rows (PostgreSQL 18's statistics import):
    1% sent to other topics, keys nearly unique, 1% with one of 100,000 ordering keys.

    The planner scales reltuples/relpages by the relation's real size in pages, so each relation gets
    one page holding all its forged rows, and one real row so that it has that page."""
    conn.execute("INSERT INTO chronos_messages (id, deadline, key, topic, ordering_key) "
                 "VALUES ('seed', now() + interval '1 year', 'seed', 't.seed', 'seed')")
    for rel, rows in (("chronos_messages", FAKE_ROWS), ("chronos_messages_pkey", FAKE_ROWS),
                      ("chronos_messages_due", FAKE_ROWS), ("chronos_messages_topic", FAKE_ROWS // 100),
                      ("chronos_messages_key", FAKE_ROWS), ("chronos_messages_ordering", FAKE_ROWS // 100),
                      ("chronos_messages_readied", 1000), ("chronos_messages_schedules", 1000)):
        pages = conn.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                             (rel,)).fetchone()[0]
        conn.execute("SELECT pg_restore_relation_stats('schemaname', 'public', 'relname', %s::text, "
                     "'relpages', %s::integer, 'reltuples', %s::real)", (rel, pages, float(rows)))
    for column, null_frac, n_distinct in (("topic", 0.99, 20.0), ("key", 0.0, -0.9), ("ordering_key", 0.99, 100000.0),
                                          ("readied_at", 0.9999, -1.0), ("cron", 0.9999, 1000.0),
                                          ("id", 0.0, -1.0), ("deadline", 0.0, -1.0), ("seq", 0.0, -1.0)):
        conn.execute("SELECT pg_restore_attribute_stats('schemaname', 'public', 'relname', 'chronos_messages', "
                     "'attname', %s::text, 'inherited', false, 'null_frac', %s::real, 'avg_width', 16, "
                     "'n_distinct', %s::real)", (column, null_frac, n_distinct))


def plan(conn, f: Filters, after: str | None = None) -> str:
    from chronos.adapters.postgres.queries import QUERIES
    params = inspect._params(f, 50, cursor=inspect.decode_cursor(after) if after else None)
    sql = QUERIES["list_by_id" if f.id_prefix else "list_by_deadline"]
    with conn.cursor() as cur:
        cur.execute("EXPLAIN " + sql, params, prepare=False)
        return "\n".join(row[0] for row in cur.fetchall())


LATER = datetime(2030, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("f, index", [
    (Filters(), "chronos_messages_due"),
    (Filters(state="waiting"), "chronos_messages_due"),
    (Filters(state="in_flight"), "chronos_messages_readied"),
    (Filters(state="recurring"), "chronos_messages_schedules"),
    (Filters(due_after=LATER), "chronos_messages_due"),
    (Filters(due_before=LATER, state="waiting"), "chronos_messages_due"),
    (Filters(topic="t.other"), "chronos_messages_topic"),
    (Filters(output_topic=True, state="waiting"), "chronos_messages_due"),
    (Filters(key=b"customer-17"), "chronos_messages_key"),
    (Filters(ordering_key="invoice-9"), "chronos_messages_ordering"),
    (Filters(id_prefix="order-17"), "chronos_messages_pkey"),
    (Filters(id_prefix="order-", state="waiting", key=b"k"), "chronos_messages_"),
])
def test_every_list_filter_is_served_by_an_index_on_ten_million_rows(database_url, f, index):
    with psycopg.connect(database_url, autocommit=True) as conn:
        forge_statistics(conn)
        assert conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'chronos_messages'").fetchone()[0] \
            == FAKE_ROWS
        text = plan(conn, f)
        nxt = plan(conn, f, after=inspect.encode_cursor("i", ["order-17x"]) if f.id_prefix
                   else inspect.encode_cursor("d", [1_900_000_000_000_000, 42]))
    for p in (text, nxt):
        assert "Seq Scan" not in p, p
        assert index in p, p
        # the first page costs next to nothing: no sort of every match (a sort or a scan of 10M rows
        # costs 100,000 and more in the planner's units)
        total = float(re.match(r"^\S.*?cost=[0-9.]+\.\.([0-9.]+) ", p).group(1))
        assert total < 1000, p
    if f.id_prefix == "order-17":
        assert "Index Cond: ((id >= 'order-17'::text) AND (id < 'order-18'::text))" in text, text


# -- the DST policy is stored with its schedule and steers the firer's next occurrence ----------------

def test_a_schedules_dst_policy_is_stored_replaced_and_followed(s):
    first = datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)   # 02:30 CEST, the first of two 02:30s
    us = int(first.timestamp() * 1_000_000)
    row = r("twice", us, cron="30 2 * * *", timezone="Europe/Paris")
    row.dst_policy = "repeated=both"
    assert s.insert([row]) == 1
    assert inspect.show(s, "twice", output_topic=OUT).dst_policy == "repeated=both"
    claimed = s.claim_schedules(10, 0, us + 1000)
    assert [c.deadline_us for c in claimed] == [us]
    # the second 02:30 (CET) is next, an hour later, not the next day's
    assert inspect.show(s, "twice", output_topic=OUT).deadline == datetime(2026, 10, 25, 1, 30, tzinfo=timezone.utc)
    row.dst_policy = None
    assert s.apply([], [row], []) == (0, 1, 0, 0)
    assert inspect.show(s, "twice", output_topic=OUT).dst_policy is None


def test_show_tells_failed_publishes_and_parked_messages_are_listed_newest_first(s):
    from chronos.domain.model import Parked
    due = now_us() - 1000
    s.insert([r("refused", due)])
    (claimed,) = s.claim(10, 0)
    assert s.retry_later([(claimed, "publish_failed: topic authorization failed", 60_000)]) == 1
    m = inspect.show(s, "refused", output_topic=OUT)
    assert (m.state, m.attempts, m.last_error) == ("waiting", 1, "publish_failed: topic authorization failed")
    assert inspect._to_us(m.original_deadline) == claimed.deadline_us and m.deadline > m.original_deadline
    j = inspect.to_json(m)
    assert (j["attempts"], j["original_deadline"]) == (1, inspect.iso(m.original_deadline))

    s.park([Parked(f"p{i}", f"chronos.input/0/{i}", "out", None, b"k", b"v" * 100 if i else None,
                   codec.encode_headers([("h", b"\xff")]), "message_too_large: too large") for i in range(3)])
    page = inspect.list_parked(s, limit=2)
    assert [p.message_id for p in page.items] == ["p2", "p1"] and page.cursor is not None
    assert (page.items[0].value_size, page.items[0].value_preview, page.items[0].headers) == \
        (100, b"v" * 64, [("h", b"\xff")])
    last = inspect.list_parked(s, limit=2, before=page.cursor)
    assert [(p.message_id, p.value_size, p.source) for p in last.items] == [("p0", None, "chronos.input/0/0")]
    assert last.cursor is None
