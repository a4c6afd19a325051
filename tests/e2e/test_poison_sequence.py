"""Every poison message at once, on one partition, in front of valid ones on every partition.

A valid message, a header name that is not UTF-8 (sent through librdkafka's C API), a late message
too large to publish (1,040,000 bytes), an invalid one whose dead letter is at the
producer's limit (999,800 bytes), and a valid 1.5 MB message; then 40 valid messages on every partition. Before
the fixes each of the four poisons stopped a process for good and none of the valid messages
behind them arrived. Now: every valid message is delivered once, the bad header name is
dead-lettered, the three oversized ones are parked, and no process exits or restarts.
"""

from __future__ import annotations

import time

import psycopg
from confluent_kafka import Producer

from helpers import Collector, chronos_headers
from rdkafka_raw import RawProducer

PARTITIONS = 4  # the topics fixture's partition count


def delivered(p: Producer) -> None:
    assert p.flush(30) == 0


def test_poison_messages_on_one_partition_stop_nothing(processes, broker, topics, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    roles = [processes.start(role) for role in ("consumer", "firer", "detector")]
    for proc in roles:
        processes.wait_for_log(proc, "starting: node")
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "linger.ms": 5,
                  "message.max.bytes": 2_000_000})
    now = time.time()
    # partition 0, in this order (each flushed before the next, so the order holds across producers)
    p.produce(topics["input"], b"valid", b"first", partition=0, headers=chronos_headers("first", now + 1))
    delivered(p)
    raw = RawProducer(broker.bootstrap_servers)
    try:
        raw.produce(topics["input"], b"utf8", b"v", [(b"chronosMessageId", b"bad-name"),
                                                     (b"chronosDeadline", str(int(now * 1000)).encode()),
                                                     (b"\xff\xfe", b"x")], partition=0)
        assert [err for err, _, _ in raw.flush()] == [0]
    finally:
        raw.close()
    p.produce(topics["input"], b"L" * 1_040_000, b"late-huge", partition=0,
              headers=chronos_headers("late-huge", now - 5))
    p.produce(topics["input"], b"I" * 999_800, b"invalid-huge", partition=0, headers=[("chronosDeadline", b"0")])
    p.produce(topics["input"], b"H" * 1_500_000, b"huge", partition=0, headers=chronos_headers("huge", now + 1))
    delivered(p)
    valid = {"first"}
    for part in range(PARTITIONS):
        for i in range(40):
            mid = f"ok-{part}-{i}"
            valid.add(mid)
            p.produce(topics["input"], b"v", mid.encode(), partition=part,
                      headers=chronos_headers(mid, now + (1.5 if i % 2 else -1)))
    delivered(p)

    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    collect.until(lambda _: len(collect.on(topics["output"])) >= len(valid) and collect.on(topics["dlq"]),
                  timeout=60)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        with psycopg.connect(url) as conn:
            parked = conn.execute("SELECT coalesce(message_id, ''), reason FROM chronos_parked "
                                  "ORDER BY message_id").fetchall()
        if {"huge", "late-huge"} <= {mid for mid, _ in parked}:
            break
        time.sleep(0.1)
    collect.poll_for(1.0)  # anything more would be a duplicate
    collect.close()

    out = [m.key.decode() for m in collect.on(topics["output"])]
    assert sorted(out) == sorted(valid)  # every valid message, once
    dead = {m.key: m.header_dict["chronosError"] for m in collect.on(topics["dlq"])}
    reasons = dict(parked)
    assert dead.pop(b"utf8").startswith(b"bad_header_name")
    # the invalid one's dead letter is right at the producer's limit: dead-lettered, or parked when
    # the added headers take it over; either way once, with its reason
    if dead:
        assert list(dead) == [b"invalid-huge"] and dead[b"invalid-huge"].startswith(b"missing_id")
        assert sorted(reasons) == ["huge", "late-huge"]
    else:
        assert sorted(reasons) == ["", "huge", "late-huge"] and reasons[""].startswith("missing_id")
    assert reasons["huge"].startswith("too_large") and reasons["late-huge"].startswith("too_large")
    for proc in roles:
        log = processes.log_of(proc)
        assert proc.poll() is None, log
        assert log.count("starting: node") == 1 and "Traceback" not in log, log
