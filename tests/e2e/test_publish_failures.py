"""Publishes that fail: no message stops Chronos, and none is lost.

Real processes against the real broker and PostgreSQL. A message too large for the producer
(and so for the dead-letter topic too) is parked in `chronos_parked`; a destination that keeps
refusing is retried a bounded number of times with growing intervals, then dead-lettered; a
destination the allow-list no longer allows is dead-lettered; and the rows behind all of them
fire meanwhile.
"""

from __future__ import annotations

import time

import psycopg
from confluent_kafka import Producer

from chronos import codec

from chronos.ops import status
from chronos.roles.firer.sender import iso_us
from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store

from helpers import Collector, chronos_headers, wait_for


def insert(url: str, rows: list[Row]) -> None:
    store = Store(url)
    try:
        assert store.insert(rows) == len(rows)
    finally:
        store.close()


def row(message_id: str, deadline_s: float, value: bytes = b"v", topic: str | None = None,
        cron: str | None = None) -> Row:
    return Row(message_id, int(deadline_s * 1_000_000), topic, message_id.encode(), value,
               codec.encode_headers([("trace", b"\x00t")]), cron=cron)


def scalar(url: str, sql: str, *args):
    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchone()[0]



def assert_ran_once(processes, proc) -> None:
    log = processes.log_of(proc)
    assert proc.poll() is None, log
    assert log.count("starting: node") == 1 and "Traceback" not in log, log


def test_a_message_too_large_for_any_topic_is_parked_and_the_rows_behind_it_fire(processes, broker, topics,
                                                                                  chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    now = time.time()
    # stored fine in PostgreSQL, over the producer's 1 MB message.max.bytes; first in the claim's order
    insert(url, [row("huge", now - 2.0, b"x" * 1_500_000)] + [row(f"ok-{i}", now - 1.0 + i / 1000) for i in range(20)])
    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    firer = processes.start("firer")
    collect.until(lambda ms: len(collect.on(topics["output"])) >= 20, timeout=30)
    wait_for(lambda: scalar(url, "SELECT count(*) FROM chronos_parked") == 1, what="parked")
    collect.poll_for(1.0)
    assert sorted(m.key for m in collect.on(topics["output"])) == sorted(f"ok-{i}".encode() for i in range(20))
    assert collect.on(topics["dlq"]) == []  # the dead letter was too large as well
    collect.close()
    with psycopg.connect(url) as conn:
        (mid, source, topic, value, reason), = conn.execute(
            "SELECT message_id, source, topic, value, reason FROM chronos_parked").fetchall()
        assert conn.execute("SELECT count(*) FROM chronos_messages").fetchone()[0] == 0
    assert (mid, source, topic, value) == ("huge", "store/huge", topics["output"], b"x" * 1_500_000)
    assert reason.startswith("too_large: MSG_SIZE_TOO_LARGE") and "dead-letter topic: MSG_SIZE_TOO_LARGE" in reason
    processes.wait_for_log(firer, "parked huge in chronos_parked")
    assert_ran_once(processes, firer)
    # operators see it
    store = Store(url)
    view = status.to_dict(store.overview(3000), 3000)
    store.close()
    assert view["parked"] == 1
    assert "parked" in status.render(view) and "chronos_parked" in status.render(view)


def test_oversized_late_and_invalid_messages_are_parked_and_later_ones_delivered(processes, broker, topics,
                                                                                 chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    consumer, firer = processes.start("consumer"), processes.start("firer")
    processes.wait_for_log(consumer, "starting: node")
    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "acks": "all",
                  "message.max.bytes": 2_000_000})
    now = time.time()
    # one partition (one key): the poison first, valid messages behind it
    p.produce(topics["input"], b"L" * 1_040_000, b"same", headers=chronos_headers("late-huge", now - 5))
    p.produce(topics["input"], b"I" * 999_950, b"same", headers=[("chronosDeadline", b"0")])  # no id: invalid
    for i in range(5):
        p.produce(topics["input"], b"v", b"same", headers=chronos_headers(f"ok-late-{i}", now - 1))
        p.produce(topics["input"], b"v", b"same", headers=chronos_headers(f"ok-later-{i}", now + 1.5))
    assert p.flush(30) == 0
    collect.until(lambda ms: len(collect.on(topics["output"])) >= 10, timeout=40)
    wait_for(lambda: scalar(url, "SELECT count(*) FROM chronos_parked") == 2, what="two parked")
    collect.poll_for(1.0)
    assert len(collect.on(topics["output"])) == 10 and collect.on(topics["dlq"]) == []
    collect.close()
    with psycopg.connect(url) as conn:
        parked = conn.execute("SELECT message_id, topic, length(value), reason FROM chronos_parked "
                              "ORDER BY length(value) DESC").fetchall()
    late, invalid = parked
    assert late[:3] == ("late-huge", topics["output"], 1_040_000)
    assert late[3].startswith("too_large: MSG_SIZE_TOO_LARGE") and "dead-letter topic" in late[3]
    assert invalid[:3] == (None, topics["dlq"], 999_950)
    assert invalid[3].startswith("missing_id") and "dead-letter topic: MSG_SIZE_TOO_LARGE" in invalid[3]
    processes.wait_for_log(consumer, "in chronos_parked")
    assert_ran_once(processes, consumer)
    assert_ran_once(processes, firer)


def test_a_destination_that_keeps_refusing_is_retried_with_backoff_then_dead_lettered(processes, broker, topics,
                                                                                     chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    now = time.time()
    # a destination the broker refuses every time (an invalid topic name, allowed by the pattern)
    insert(url, [row("refused", now - 2.0, topic="bad topic!")] + [row(f"ok-{i}", now - 1.0) for i in range(20)])
    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    firer = processes.start("firer", CHRONOS_ALLOWED_TOPICS=".*", CHRONOS_MAX_PUBLISH_ATTEMPTS="3")
    seen: dict[int, float] = {}  # attempts -> when first seen; -1: the row left the store

    def watch():
        with psycopg.connect(url) as conn:
            got = conn.execute("SELECT attempts FROM chronos_messages WHERE id = 'refused'").fetchone()
            if conn.execute("SELECT count(*) FROM chronos_messages WHERE id LIKE 'ok-%'").fetchone()[0] == 0:
                seen.setdefault(-2, time.monotonic())  # the rows behind it: fired and deleted
        seen.setdefault(-1 if got is None else got[0], time.monotonic())
        return -1 in seen
    wait_for(watch, timeout=30, what="the refused row dead-lettered")
    collect.until(lambda ms: len(collect.on(topics["dlq"])) >= 1 and len(collect.on(topics["output"])) >= 20)
    collect.poll_for(1.0)
    collect.close()
    # three tries: the first right away, the next after about 1 s, the last about 2 s after that
    assert set(seen) - {0} == {1, 2, -1, -2}, seen
    first_gap, second_gap = seen[2] - seen[1], seen[-1] - seen[2]
    assert 0.5 < first_gap < second_gap, (first_gap, second_gap)
    dead, = collect.on(topics["dlq"])
    assert (dead.key, dead.value) == (b"refused", b"v")
    headers = dead.header_dict
    assert headers["chronosMessageId"] == b"refused" and headers["chronosTopic"] == b"bad topic!"
    assert headers["chronosDeadline"] == iso_us(int((now - 2.0) * 1_000_000)).encode()  # as scheduled
    assert headers["trace"] == b"\x00t" and headers["chronosSource"] == b"store/refused"
    error = headers["chronosError"].decode()
    # the broker's TOPIC_EXCEPTION, then librdkafka's own _UNKNOWN_TOPIC for that topic
    assert error.startswith("publish_failed: ") and error.endswith("(3 attempts)"), error
    # the rows behind it fired meanwhile, before its second try
    assert len(collect.on(topics["output"])) == 20
    assert seen[-2] < seen[2], seen
    assert_ran_once(processes, firer)


def test_a_destination_the_allow_list_no_longer_allows_is_dead_lettered(processes, broker, topics, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    now = time.time()
    # accepted while `adv\..*` was allowed; the firer runs with the default allow-list (the output topic only). The
    # schedule comes again only on 1 January: one of every minute came twice when the run crossed the start of a minute
    insert(url, [row("one-shot", now - 1.0, topic="adv.secret"), row("ok", now - 1.0),
                 row("yearly", now + 0.5, topic="adv.secret", cron="0 0 1 1 *")])
    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"], "adv.secret"])
    firer = processes.start("firer")
    collect.until(lambda ms: len(collect.on(topics["dlq"])) >= 2 and len(collect.on(topics["output"])) >= 1)
    collect.poll_for(1.0)
    collect.close()
    assert collect.on("adv.secret") == []
    dead = sorted(collect.on(topics["dlq"]), key=lambda m: m.key)
    assert [m.key for m in dead] == [b"one-shot", b"yearly"]
    for m in dead:
        assert m.header_dict["chronosError"].startswith(b"topic_not_allowed: 'adv.secret'")
        assert m.header_dict["chronosTopic"] == b"adv.secret"
    assert dead[1].header_dict["chronosMessageId"].startswith(b"yearly@")
    assert "chronosOccurrence" in dead[1].header_dict
    assert scalar(url, "SELECT count(*) FROM chronos_messages WHERE cron IS NULL") == 0
    assert_ran_once(processes, firer)
