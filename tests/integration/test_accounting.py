"""The benchmarks' account of undelivered messages, against a real broker and PostgreSQL: every
state a message can be in is found where it is."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.harness.accounting import account, render
from chronos import codec
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Parked, Row
from helpers import EMBEDDED_KAFKA


def test_every_undelivered_message_is_found_where_it_is(broker, topics, database_url):
    bootstrap = broker.bootstrap_servers
    group = f"chronos-{uuid.uuid4().hex[:8]}"
    ids = ["run-7", "waiting", "retrying", "held", "parked", "dead", "read-and-gone", "unread", "never-stored"]
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def send(topic: str, mid: str, **extra: bytes) -> None:
        p.produce(topic, b"v", b"k", headers=[("chronosMessageId", mid.encode()), *extra.items()], partition=0)

    # on the output topic a message has no chronos header left: the benchmarks know it by theirs
    p.produce(topics["output"], b"v", b"k", headers=[("bench-run", b"run"), ("bench-id", b"7")], partition=0)
    send(topics["dlq"], "dead", chronosError=b"bad_deadline: nope")
    send(topics["input"], "read-and-gone")
    send(topics["input"], "unread")
    assert p.flush(10) == 0
    # the consumer group has read the input topic up to (not including) "unread"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **EMBEDDED_KAFKA})
    c.commit(offsets=[TopicPartition(topics["input"], 0, 1)], asynchronous=False)
    c.close()
    now = int(time.time() * 1e6)
    store = Store(database_url, node_id=uuid.uuid4())
    try:
        store.insert([Row(mid, now + 3_600_000_000, None, b"k", b"v", codec.encode_headers([]))
                      for mid in ("waiting", "retrying", "held")])
        store.park([Parked("parked", "store/parked", topics["output"], datetime.now(timezone.utc), b"k", b"v",
                           codec.encode_headers([]), "too_large: MSG_SIZE_TOO_LARGE")])
    finally:
        store.close()
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE chronos_messages SET attempts = 2, last_error = 'UNKNOWN_TOPIC_OR_PART: gone' "
                     "WHERE id = 'retrying'")
        conn.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = gen_random_uuid() WHERE id = 'held'")
    got = account(ids, database_url=database_url, bootstrap=bootstrap, input_topic=topics["input"],
                  output_topics=[topics["output"]], dlq_topic=topics["dlq"], consumer_group=group,
                  conf=EMBEDDED_KAFKA)
    assert got["by_state"] == {"delivered_after_all": 1, "waiting": 2, "held": 1, "parked": 1, "dead_lettered": 1,
                               "not_consumed": 1, "consumed_and_gone": 1, "not_on_input": 1}
    assert not got["explained"]  # a message read and gone, and one never stored, are real losses
    text = render(got)
    assert "2 failed publishes, last: UNKNOWN_TOPIC_OR_PART: gone" in text
    assert "dead_lettered: dead: bad_deadline: nope" in text and "too_large: MSG_SIZE_TOO_LARGE" in text
    assert f"read-and-gone: {topics['input']}[0]@0, committed offset 1" in text
    assert account([], database_url=database_url, bootstrap=bootstrap, input_topic=topics["input"],
                   output_topics=[topics["output"]], dlq_topic=topics["dlq"], consumer_group=group)["explained"]
