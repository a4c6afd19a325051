"""The SQL of publish failures against a real PostgreSQL: retry with backoff, parking, and their plans;
and `kafka.produce` against the real broker when librdkafka refuses a message in `produce()`."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from chronos import codec

from chronos.domain import cron
from chronos.adapters.kafka import PERMANENT_FAILURE, classify, produce
from chronos.adapters.postgres.store import QUERIES, Store
from chronos.domain.model import Parked, Row
from helpers import claim_plan


def now_us() -> int:
    return time.time_ns() // 1000


@pytest.fixture
def s(database_url):
    st = Store(database_url, node_id=uuid.uuid4())
    yield st
    st.close()


def fetch(url, sql, *args):
    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()


def test_retry_later_counts_the_failure_and_moves_the_row_out_of_the_claim(s, database_url):
    due = now_us() - 1_000_000
    s.insert([Row("bad", due, "t.x", b"k", b"v", b""), Row("good", due + 1, None, b"k", b"v", b"")])
    bad, good = s.claim(10, 0)
    assert (bad.attempts, bad.original_deadline_us) == (0, None)
    assert s.retry_later([(bad, "TOPIC_EXCEPTION: Broker: Invalid topic", 60_000)]) == 1
    s.release([good])
    # the failing row left the head of the claim: the row behind it is claimed, the failing one is not
    assert [r.id for r in s.claim(10, 0)] == ["good"]
    (attempts, error, original, moved), = fetch(
        database_url, "SELECT attempts, last_error, (extract(epoch FROM original_deadline) * 1000000)::bigint, "
                      "extract(epoch FROM deadline - now()) FROM chronos_messages WHERE id = 'bad'")
    assert (attempts, error, original) == (1, "TOPIC_EXCEPTION: Broker: Invalid topic", due)
    assert 55 < moved <= 60
    # due again: claimed with its count and its deadline as scheduled, which a second retry keeps
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_messages SET deadline = now() - interval '1 second' WHERE id = 'bad'")
    again, = s.claim(10, 0)
    assert (again.attempts, again.original_deadline_us, again.scheduled_us) == (1, due, due)
    assert s.retry_later([(again, "e2", 1000)]) == 1
    assert fetch(database_url, "SELECT attempts, (extract(epoch FROM original_deadline) * 1000000)::bigint "
                               "FROM chronos_messages WHERE id = 'bad'") == [(2, due)]


def test_a_replace_starts_the_new_version_with_no_failed_publishes(s, database_url):
    due = now_us() - 1_000_000
    s.insert([Row("r", due, "t.bad", None, b"v1", b"")])
    held, = s.claim(10, 0)
    s.retry_later([(held, "TOPIC_EXCEPTION", 60_000)])
    s.apply([], [Row("r", due + 5, "t.good", None, b"v2", b"")], [])
    # the new version is due as sent, with none of the old version's failures or backoff
    again, = s.claim(10, 0)
    assert (again.value, again.attempts, again.original_deadline_us, again.scheduled_us) == (b"v2", 0, None, due + 5)
    assert fetch(database_url, "SELECT last_error FROM chronos_messages") == [(None,)]


def test_retry_later_touches_only_rows_still_held_as_claimed(database_url):
    a, b = Store(database_url, node_id=uuid.uuid4()), Store(database_url, node_id=uuid.uuid4())
    a.insert([Row("m", now_us() - 1000, None, None, b"v", b"")])
    held = a.claim(10, 0)
    with psycopg.connect(database_url, autocommit=True) as conn:  # a detector handed it to a peer
        conn.execute("UPDATE chronos_messages SET readied_at = NULL, readied_by = NULL")
    b.claim(10, 0)
    assert a.retry_later([(held[0], "late news", 1000)]) == 0
    assert a.park_claimed([(held[0], "too_large: x")], "out") == 0
    assert fetch(database_url, "SELECT attempts FROM chronos_messages") == [(0,)]


def test_a_row_in_backoff_still_holds_back_later_rows_of_its_key(s):
    t = now_us() - 2_000_000
    rows = [Row(f"o-{i}", t + i * 1000, None, None, b"v", b"", ordering_key="K") for i in range(3)]
    s.insert(rows + [Row("free", t + 5000, None, None, b"v", b"")])
    claimed = s.claim(10, 0)
    assert [r.id for r in claimed] == ["o-0", "o-1", "o-2", "free"]
    first = claimed[0]
    s.retry_later([(first, "refused", 60_000)])   # o-0 now waits a minute, its deadline moved past o-1's
    s.release(claimed[1:])
    assert [r.id for r in s.claim(10, 0)] == ["free"]
    assert s.claim(10, 0) == []
    # its backoff over: the key goes on in the order as scheduled, o-0 first
    with psycopg.connect(s.url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_messages SET deadline = now() - interval '1 second' WHERE id = 'o-0'")
    assert [r.id for r in s.claim(10, 0)] == ["o-0", "o-1", "o-2"]


def test_park_claimed_moves_the_row_in_one_statement(s, database_url):
    due = now_us() - 1_000_000
    headers = codec.encode_headers([("h", b"\x00\xff"), ("h", None)])
    s.insert([Row("big", due, None, None, b"x" * 1000, headers), Row("routed", due, "other", b"k", None, b"")])
    big, routed = s.claim(10, 0)
    s.retry_later([(big, "refused", 0)])  # parked after a retry: with the deadline as scheduled
    s.release([routed])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_messages SET deadline = now() - interval '1 second' WHERE id = 'big'")
    big, routed = sorted(s.claim(10, 0), key=lambda r: r.id)
    assert s.park_claimed([(big, "too_large: a; dead-letter topic: b"), (routed, "topic_not_allowed: c")],
                          "out") == 2
    assert fetch(database_url, "SELECT count(*) FROM chronos_messages") == [(0,)]
    got = fetch(database_url, "SELECT message_id, source, topic, (extract(epoch FROM deadline) * 1000000)::bigint, "
                              "key, value, headers, reason FROM chronos_parked ORDER BY message_id")
    assert got == [("big", "store/big", "out", due, None, b"x" * 1000, headers, "too_large: a; dead-letter topic: b"),
                   ("routed", "store/routed", "other", due, b"k", None, b"", "topic_not_allowed: c")]
    assert s.overview(5000).parked == 2


def test_park_keeps_a_consumer_message(s, database_url):
    s.park([Parked(None, "in/0/7", "dlq", None, None, b"v", codec.encode_headers([("a", b"b")]), "bad_id: x; y"),
            Parked("m-1", "in/1/3", "out", cron.from_us(1_700_000_000_000_001), b"k", b"v", b"", "too_large: z")])
    assert fetch(database_url, "SELECT message_id, source, (extract(epoch FROM deadline) * 1000000)::bigint "
                               "FROM chronos_parked ORDER BY id") == [(None, "in/0/7", None),
                                                                       ("m-1", "in/1/3", 1_700_000_000_000_001)]
    assert s.overview(5000).parked == 2


@pytest.mark.parametrize("query,types,extra,expect", [
    ("retry_later", "text[], timestamptz[], uuid, text[], bigint[]", (["e"] * 1000, [1000] * 1000), 1000),
    ("park_claimed", "text[], timestamptz[], uuid, text[], text", (["r"] * 1000, "out"), 1000),
])
def test_failure_statements_find_rows_by_primary_key_under_a_generic_plan(database_url, query, types, extra, expect):
    """Like delete_fired: with statistics taken while nothing was in flight, a generic plan must still
    find the rows through the primary key, not loop over every in-flight row for every id."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline) SELECT 'f' || g, now() + interval '2 years' "
                     "FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE chronos_messages")
    st = Store(database_url, node_id=uuid.uuid4())
    st.insert([Row(f"d{i}", now_us() - 1000, None, None, b"v", b"") for i in range(3000)])
    held = st.claim(3000, 0)[:1000]
    last = "%(errors)s" if query == "retry_later" else "%(reasons)s"
    fifth = "%(delay_ms)s" if query == "retry_later" else "%(output_topic)s"
    sql = (QUERIES[query].replace("%(ids)s", "$1").replace("%(readied_at)s", "$2").replace("%(node)s", "$3")
           .replace(last, "$4").replace(fifth, "$5"))
    with psycopg.connect(database_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE q({types}) AS " + sql)
        plan = "\n".join(row[0] for row in conn.execute(
            "EXPLAIN EXECUTE q(%s, %s, %s, %s, %s)", ([x.id for x in held], [x.readied_at for x in held], st.node_id,
                                                     *extra)))
    assert "chronos_messages_pkey" in plan, plan
    if query == "retry_later":
        assert st.retry_later([(x, "e", 1000) for x in held]) == expect
    else:
        assert st.park_claimed([(x, "r") for x in held], "out") == expect
    st.close()


def test_produce_hands_a_refusal_inside_produce_to_the_delivery_callback(broker):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": broker.bootstrap_servers})
    got = []
    produce(p, f"t-{uuid.uuid4().hex[:8]}", b"x" * 1_500_000, b"k", [("h", b"v")], lambda err, msg: got.append(err))
    assert len(got) == 1 and got[0].code() == got[0].MSG_SIZE_TOO_LARGE
    assert classify(got[0]) == PERMANENT_FAILURE


def test_the_claim_s_ordering_check_stays_on_the_ordering_indexes(database_url):
    """The check of earlier rows of a key uses the ordering index with the deadline as an index
    condition, and the small index of retried rows: never every row of a busy key."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline, ordering_key) "
                     "SELECT 'f' || g, now() + (g % 1000) * interval '1 hour', 'key-' || (g % 50) "
                     "FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE chronos_messages")
        plan = claim_plan(conn)
    assert "using chronos_messages_ordering on" in plan, plan
    # both ends of the range between a candidate and the one before it of its key: index conditions
    assert "(ROW(deadline, seq) > ROW(k.prev_place, k.prev_seq)) AND (ROW(deadline, seq) < ROW(k.place, k.seq))" \
        in plan, plan
    assert "(ROW(original_deadline, seq) > ROW(k.prev_place, k.prev_seq)) AND " \
           "(ROW(original_deadline, seq) < ROW(k.place, k.seq))" in plan, plan
    assert "using chronos_messages_ordering_retried on" in plan, plan
