"""Fire-rate limits against a real PostgreSQL: the firers together keep to a topic's rate, held-back
rows go in deadline order and never early, and other topics are not held up."""

from __future__ import annotations

import random
import threading
import time
import uuid

import psycopg
import pytest

from chronos.domain.ratelimit import FireRateLimits, TopicRates
from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store

OUT = "chronos.output"


def now_us() -> int:
    return time.time_ns() // 1000


def row(i, deadline_us, topic=None, ordering_key=None) -> Row:
    return Row(id=f"m-{i}", deadline_us=deadline_us, topic=topic, key=b"k", value=b"v", headers=b"",
               ordering_key=ordering_key)


def limits(**rates) -> FireRateLimits:
    return FireRateLimits(TopicRates(tuple((t.replace("_", "."), r) for t, r in rates.items())))


@pytest.fixture
def firers(database_url):
    stores = [Store(database_url, node_id=uuid.uuid4()) for _ in range(2)]
    yield stores
    for st in stores:
        st.close()


def pass_time(url: str, topic: str, seconds: float) -> None:
    """Let `seconds` pass for a bucket without waiting: move its last refill back."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_rate_limits SET refilled_at = refilled_at - %s * interval '1 second' "
                     "WHERE topic = %s", (seconds, topic))


def db_now(url: str):
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def test_two_firers_together_never_take_more_than_the_budget(firers, database_url):
    rate = 10.0   # capacity: one second of it, 10 rows
    firers[0].insert([row(i, now_us() - 60_000_000 + i, topic="fragile") for i in range(1000)])
    lim = limits(fragile=rate)
    taken: list[list] = [[], []]
    started = db_now(database_url)
    rounds, step = 12, 1.0

    def both_claim():
        barrier = threading.Barrier(2)

        def one(k):
            barrier.wait()
            for _ in range(3):  # several tries each: the second and third find the bucket drained
                taken[k] += firers[k].claim_limited(lim, OUT, 500, 300)[0]
        threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    both_claim()
    for _ in range(rounds):
        pass_time(database_url, "fragile", step)
        both_claim()
    real = (db_now(database_url) - started).total_seconds()
    ids = [r.id for r in taken[0] + taken[1]]
    assert len(ids) == len(set(ids)), "a row was claimed by both firers"
    budget = rate + rate * (rounds * step + real)   # a full bucket, then the rate over all time that passed
    assert len(ids) <= budget
    # and the budget is used: every refill finds due rows waiting
    assert len(ids) >= rate + rate * rounds * step
    assert taken[0] and taken[1], "both firers took part"


def test_held_back_rows_fire_in_deadline_order_and_never_early(firers, database_url):
    st = firers[0]
    base = now_us()
    deadlines = [base - 5_000_000 + i * 1000 for i in range(60)]
    random.Random(7).shuffle(deadlines)
    st.insert([row(i, d, topic="fragile") for i, d in enumerate(deadlines)])
    st.insert([row("soon", base + 30_000_000, topic="fragile")])   # within the lookahead given, not due
    lim = limits(fragile=10.0)
    claimed = []
    for _ in range(8):
        got = st.claim_limited(lim, OUT, 500, 60_000)[0]
        for r in got:
            assert r.deadline_us <= r.readied_at.timestamp() * 1e6, f"{r.id} claimed before its deadline"
        claimed += got
        pass_time(database_url, "fragile", 1.0)
    assert [r.deadline_us for r in claimed] == sorted(deadlines)[:len(claimed)]
    assert len(claimed) == 60  # 10 at first, then 10 per second that passed
    assert "m-soon" not in {r.id for r in claimed}


def test_a_throttled_backlog_does_not_hold_up_other_topics(firers):
    st = firers[0]
    base = now_us()
    st.insert([row(i, base - 10_000_000 + i, topic="fragile") for i in range(500)])
    st.insert([row(f"o{i}", base - 1_000_000 + i) for i in range(50)])               # the output topic
    st.insert([row(f"x{i}", base - 1_000_000 + i, topic="other") for i in range(50)])
    rows, full = st.claim_limited(limits(fragile=10.0), OUT, 200, 300)
    topics = [r.topic for r in rows]
    assert topics.count("fragile") == 10 and topics.count(None) == 50 and topics.count("other") == 50
    assert not full


def test_the_default_and_patterns_limit_each_topic_apart(firers):
    st = firers[0]
    base = now_us()
    for topic in ("pay.eu", "pay.us", "misc"):
        st.insert([row(f"{topic}-{i}", base - 1_000_000 + i, topic=topic) for i in range(100)])
    st.insert([row(f"out-{i}", base - 1_000_000 + i) for i in range(100)])
    lim = FireRateLimits(TopicRates((("pay.*", 5.0), ("misc", None))), default=20.0)
    rows, _ = st.claim_limited(lim, OUT, 1000, 300)
    by_topic = {t: sum(1 for r in rows if r.topic == t) for t in ("pay.eu", "pay.us", "misc", None)}
    assert by_topic == {"pay.eu": 5, "pay.us": 5, "misc": 100, None: 20}


def test_an_ordering_key_waits_for_its_throttled_earlier_row(firers):
    st = firers[0]
    base = now_us()
    st.insert([row(i, base - 10_000_000 + i, topic="fragile") for i in range(20)])
    st.insert([row("first", base - 5_000_000, topic="fragile", ordering_key="K"),
               row("second", base - 4_000_000, topic="other", ordering_key="K")])
    rows, _ = st.claim_limited(limits(fragile=10.0), OUT, 200, 300)
    assert {r.id for r in rows} & {"m-first", "m-second"} == set()  # the first is behind the backlog


def test_throttled_backlog_and_lateness_per_limited_topic(firers):
    st, peer = firers
    base = now_us()
    st.insert([row(i, base - 3_000_000 + i, topic="fragile") for i in range(30)])
    st.insert([row(f"o{i}", base - 3_000_000) for i in range(5)])   # unlimited output topic: not listed
    st.insert([row("later", base + 60_000_000, topic="slow")])     # limited, nothing due: no bucket written
    assert peer.throttled(OUT) == []                               # no firer limited anything yet
    st.claim_limited(limits(fragile=10.0, slow=1.0), OUT, 200, 300)
    # read from the buckets the firers keep: a reader needs no limits of its own
    (found,) = peer.throttled(OUT)
    assert (found.topic, found.rows, found.rate) == ("fragile", 20, 10.0)
    assert 2.5 < found.lateness_s < 60


def test_the_output_topic_has_its_own_bucket(firers):
    st = firers[0]
    base = now_us()
    st.insert([row(i, base - 1_000_000 + i) for i in range(30)])
    rows, _ = st.claim_limited(limits(chronos_output=5.0), OUT, 200, 300)
    assert len(rows) == 5
    (t,) = st.throttled(OUT)
    assert (t.topic, t.rows) == (OUT, 25)


def test_a_topic_claim_and_the_topic_list_use_the_topic_index(firers, database_url):
    base = now_us()
    st = firers[0]
    st.insert([row(i, base + 3_600_000_000 + i, topic=f"t{i % 5}") for i in range(5000)])
    st.insert([row(f"o{i}", base + 3_600_000_000 + i) for i in range(5000)])
    from chronos.adapters.postgres.store import QUERIES
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ANALYZE chronos_messages")
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as the firer's prepared statement runs
        params = {"node": uuid.uuid4(), "limit": 10, "lookahead_ms": 0, "topic": "t1"}
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + QUERIES["claim_topic"], params))
        assert "chronos_messages_topic" in plan, plan
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + QUERIES["waiting_topics"]))
        assert "chronos_messages_topic" in plan and "Seq Scan" not in plan, plan


def test_a_limited_backlog_is_drained_without_sleeping_only_while_the_batch_not_the_budget_ends_it(firers):
    st = firers[0]
    base = now_us()
    st.insert([row(i, base - 1_000_000 + i, topic="fast") for i in range(500)])
    rows, full = st.claim_limited(limits(fast=1000.0), OUT, 100, 300)
    assert (len(rows), full) == (100, True)      # the batch ended it: claim again at once
    rows, full = st.claim_limited(limits(fast=1000.0), OUT, 1000, 300)
    assert len(rows) < 1000 and not full        # the budget (or the due rows) ended it: wait for the poll


def test_unlimited_topics_share_the_batch_so_one_backlog_does_not_starve_another(firers):
    st = firers[0]
    base = now_us()
    st.insert([row(f"o{i}", base - 10_000_000 + i) for i in range(1000)])                 # older backlog
    st.insert([row(f"x{i}", base - 1_000_000 + i, topic="other") for i in range(30)])
    st.insert([row(f"f{i}", base - 1_000_000 + i, topic="fragile") for i in range(30)])
    rows, full = st.claim_limited(limits(fragile=5.0), OUT, 100, 300)
    topics = [r.topic for r in rows]
    assert (topics.count("fragile"), topics.count("other"), topics.count(None)) == (5, 30, 65)
    assert full


def test_a_keys_rows_leave_a_limited_topic_in_order_one_grant_at_a_time(firers, database_url):
    a, b = firers
    base = now_us()
    a.insert([row(i, base - 5_000_000 + i * 1000, topic="fragile", ordering_key="K") for i in range(6)])
    got = []
    for k in range(6):
        rows = (a, b)[k % 2].claim_limited(limits(fragile=1.0), OUT, 100, 300)[0]  # one token a second
        assert len(rows) == 1
        got += rows
        (a, b)[k % 2].delete_fired(rows)   # published: the next of the key may go
        pass_time(database_url, "fragile", 1.0)
    assert [r.id for r in got] == [f"m-{i}" for i in range(6)]
