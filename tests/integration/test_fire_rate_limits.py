"""Fire-rate limits against a real PostgreSQL: the claim of one topic and the list of topics stay on
the topic index. (What the limits do, both stores alike, is in the contract suite, tests/contract.)"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store


def now_us() -> int:
    return time.time_ns() // 1000


def row(i, deadline_us, topic=None, ordering_key=None) -> Row:
    return Row(id=f"m-{i}", deadline_us=deadline_us, topic=topic, key=b"k", value=b"v", headers=b"",
               ordering_key=ordering_key)


@pytest.fixture
def firers(database_url):
    stores = [Store(database_url, node_id=uuid.uuid4()) for _ in range(2)]
    yield stores
    for st in stores:
        st.close()


def test_a_topic_claim_and_the_topic_list_use_the_topic_index(firers, database_url):
    """A topic's claim reads its own rows only, off the topic index: not the other topics' due rows (a throttled
    backlog of one topic in front of another's), nor the far-future ones."""
    base = now_us()
    st = firers[0]
    st.insert([row(i, base - 60_000_000 + i, topic=f"t{i % 5}") for i in range(5000)])
    st.insert([row(f"o{i}", base - 60_000_000 + i) for i in range(5000)])
    st.insert([row(f"f{i}", base + 3_600_000_000 + i, topic=f"t{i % 5}") for i in range(5000)])
    from chronos.adapters.postgres.queries import QUERIES
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ANALYZE chronos_messages")
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as the firer's prepared statement runs
        params = {"node": uuid.uuid4(), "limit": 10, "lookahead_ms": 0, "topic": "t1"}
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + QUERIES["claim_topic"], params))
        assert "chronos_messages_topic" in plan, plan
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + QUERIES["waiting_topics"]))
        assert "chronos_messages_topic" in plan and "Seq Scan" not in plan, plan

