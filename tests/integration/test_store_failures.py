"""The plans of the publish failures' statements (retry with backoff, parking) against a real
PostgreSQL, and the Kafka adapter's `Producer.send` against the real broker when librdkafka refuses a
message in `produce()`. (What retry and parking do, both stores alike, is in the contract suite, tests/contract.)"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from chronos.adapters.kafka.clients import Producer
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.store import Store
from chronos.domain.delivery import PERMANENT_FAILURE, classify
from chronos.domain.model import Row
from helpers import claim_plan


def now_us() -> int:
    return time.time_ns() // 1000


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


def test_send_hands_a_refusal_inside_produce_to_the_delivery_callback(broker):
    p = Producer({"bootstrap.servers": broker.bootstrap_servers})
    got = []
    p.send(f"t-{uuid.uuid4().hex[:8]}", b"x" * 1_500_000, b"k", [("h", b"v")], lambda err, msg: got.append(err))
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
