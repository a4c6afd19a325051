"""A producer the broker refuses never silences Chronos: real firer processes against the real broker.

A topic deleted and created again under load makes the embedded broker fence the firer's idempotent
producer on every topic (PRODUCER_FENCED, not marked fatal); a broker that restarts has forgotten
every producer, whose publishes then wait for an answer that never comes. In both, the firer
replaces its producer and hands the rows back uncounted: every message of every topic is
delivered once the topic is back, none dead-lettered.
"""

from __future__ import annotations

import time

import psycopg

from chronos import codec
from chronos.adapters.kafka.admin import admin_client, create_topics
from chronos.domain.model import Row
from chronos.embedded.broker import EmbeddedBroker

from helpers import Collector, wait_for
from test_publish_failures import insert


def rows(prefix: str, topic: str | None, start: float, count: int, every: float) -> list[Row]:
    """`count` rows due from `start` (epoch seconds) on, `every` seconds apart; the value is the id."""
    return [Row(f"{prefix}-{i}", int((start + i * every) * 1e6), topic, f"{prefix}-{i}".encode(),
                f"{prefix}-{i}".encode(), codec.encode_headers([])) for i in range(count)]


def waiting(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT id, attempts FROM chronos_messages ORDER BY id").fetchall()


def values(messages) -> set[bytes]:
    return {m.value for m in messages}


def test_a_topic_deleted_and_created_again_under_load_fences_nothing_for_good(processes, broker, topics,
                                                                             chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    output, other, dlq = topics["output"], topics["output"] + ".other", topics["dlq"]
    create_topics(broker.bootstrap_servers, {other: 4})
    collect = Collector(broker.bootstrap_servers, [other, dlq])
    firer = processes.start("firer", CHRONOS_ALLOWED_TOPICS=".*")
    processes.wait_for_log(firer, "firing from the store")
    now = time.time()
    # 100 msg/s to each topic for 4 s, through the deletion
    insert(url, rows("before-out", None, now + 0.5, 400, 0.01) + rows("before-other", other, now + 0.5, 400, 0.01))
    time.sleep(1.5)  # the load is under way (the firer has fired the first rows)
    admin = admin_client(broker.bootstrap_servers)
    admin.delete_topics([output])[output].result()
    time.sleep(1.0)  # the topic stays away for a while, as an operator's mistake would
    create_topics(broker.bootstrap_servers, {output: 4})
    back = time.time()
    insert(url, rows("after-out", None, back + 0.5, 300, 0.01) + rows("after-other", other, back + 0.5, 300, 0.01))
    # everything leaves the store: fired, nothing left to retry
    wait_for(lambda: not waiting(url), timeout=60, what=f"every row fired (waiting: {waiting(url)[:5]})")
    reader = Collector(broker.bootstrap_servers, [output])
    reader.until(lambda ms: {f"after-out-{i}".encode() for i in range(300)} <= values(ms), timeout=30)
    collect.until(lambda ms: {f"{p}-other-{i}".encode() for p in ("before", "after") for i in range(300)}
                  <= values(collect.on(other)), timeout=30)
    collect.poll_for(1.0)
    assert {f"before-other-{i}".encode() for i in range(400)} <= values(collect.on(other))
    assert collect.on(dlq) == []  # nothing dead-lettered
    log = processes.log_of(firer)
    assert "Traceback" not in log and firer.poll() is None
    collect.close()
    reader.close()


def test_a_broker_that_restarts_and_forgets_every_producer_does_not_stop_the_firer(processes, topics, chronos_env,
                                                                                  tmp_path):
    own = EmbeddedBroker(log_path=tmp_path / "broker.log")
    own.start()
    try:
        names = {topics["output"]: 4, topics["dlq"]: 4}
        create_topics(own.bootstrap_servers, names)
        url = chronos_env["CHRONOS_DATABASE_URL"]
        firer = processes.start("firer", CHRONOS_KAFKA_BOOTSTRAP_SERVERS=own.bootstrap_servers,
                                CHRONOS_PUBLISH_STALL_MS="2000")
        processes.wait_for_log(firer, "firing from the store")
        now = time.time()
        insert(url, rows("first", None, now, 50, 0.01))
        wait_for(lambda: not waiting(url), timeout=30, what="the first rows fired")
        port = own.port
        own.stop()  # memory only: every topic, offset and producer id is gone
        own = EmbeddedBroker(port=port, log_path=tmp_path / "broker-2.log")
        own.start()
        create_topics(own.bootstrap_servers, names)
        now = time.time()
        insert(url, rows("second", None, now + 0.5, 200, 0.01))
        wait_for(lambda: not waiting(url), timeout=60, what=f"every row fired (waiting: {waiting(url)[:5]})")
        reader = Collector(own.bootstrap_servers, [topics["output"], topics["dlq"]])
        reader.until(lambda ms: {f"second-{i}".encode() for i in range(200)} <= values(ms), timeout=30)
        reader.poll_for(0.5)
        assert reader.on(topics["dlq"]) == []
        reader.close()
        assert firer.poll() is None and "Traceback" not in processes.log_of(firer)
    finally:
        own.stop()
