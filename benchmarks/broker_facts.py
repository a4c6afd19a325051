"""Measure how the embedded broker behaves, for docs/operations/embedded-stack.md.

    python -m benchmarks.broker_facts [--out benchmarks/results/broker_facts.json] [--quick]

Starts its own embedded broker on a loopback port and measures, one fact at a time:

1. group join: time from subscribe() to the first assignment, with librdkafka's default session
   timeout and with the embedded profile's (2 s, heartbeat 500 ms);
2. "latest" offsets: the high watermark and OFFSET_END after batched produces, against the true
   number of messages;
3. produce→readable latency by the reader's fetch.wait.max.ms (5, 25, 50, 500 ms), with an idle
   broker;
4. reading a partition of many tiny batches from the beginning, by fetch.wait.max.ms;
5. topic auto-creation: the partition count of a topic created by a produce;
6. a produce to a deleted topic: is it acknowledged, and is it readable afterwards?

Every figure is wall-clock on the machine it runs on; the JSON records the load average too.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kits.figures import percentiles
from chronos.adapters.kafka.admin import create_topics
from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS as PROFILE
from chronos.embedded.broker import EmbeddedBroker


def _consumer(bootstrap: str, **conf: Any) -> Consumer:
    base = {"bootstrap.servers": bootstrap, "group.id": f"facts-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    base.update(conf)
    return Consumer(base)


def _producer(bootstrap: str, **conf: Any) -> Producer:
    base = {"bootstrap.servers": bootstrap, "linger.ms": 5}
    base.update(conf)
    return Producer(base)


def group_join(bootstrap: str, **conf: Any) -> float:
    """Seconds from subscribe() to the first assignment of a fresh group."""
    topic = f"facts.join.{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, {topic: 1})
    assigned: list[float] = []
    c = _consumer(bootstrap, **conf)
    started = time.monotonic()
    c.subscribe([topic], on_assign=lambda _c, _p: assigned.append(time.monotonic()))
    while not assigned and time.monotonic() - started < 120:
        c.poll(0.1)
    c.close()
    return (assigned[0] - started) if assigned else float("nan")


def latest_offsets(bootstrap: str, messages: int) -> dict[str, int]:
    """What the broker calls the end of a partition, against what was produced."""
    topic = f"facts.latest.{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, {topic: 1})
    p = _producer(bootstrap, **{"linger.ms": 20})
    for i in range(messages):
        p.produce(topic, str(i).encode(), partition=0)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(30)
    c = _consumer(bootstrap, **PROFILE)
    low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    end_reads = 0
    c.assign([TopicPartition(topic, 0, OFFSET_END)])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # anything read after seeking to the "end" was not the end
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            end_reads += 1
    c.close()
    return {"produced": messages, "high_watermark": high, "low_watermark": low,
            "read_after_offset_end": end_reads}


def fetch_latency(bootstrap: str, wait_ms: int, seconds: float, interval: float = 0.025) -> dict | None:
    """produce→readable latency (ms) of a message every `interval` s, read by a consumer at the head."""
    topic = f"facts.latency.{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, {topic: 1})
    p = _producer(bootstrap, **{"linger.ms": 0})
    c = _consumer(bootstrap, **PROFILE, **{"fetch.wait.max.ms": wait_ms})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    c.poll(0.5)
    lat: list[float] = []
    end = time.monotonic() + seconds
    next_send = time.monotonic()
    while time.monotonic() < end:
        if time.monotonic() >= next_send:
            p.produce(topic, str(time.time()).encode(), partition=0)
            p.poll(0)
            next_send += interval
        m = c.poll(0.002)
        if m is not None and m.error() is None:
            lat.append((time.time() - float(m.value())) * 1000)
    c.close()
    p.flush(5)
    return percentiles(lat)


def many_batches(bootstrap: str, batches: int, wait_ms: int) -> dict[str, float]:
    """Seconds to read `batches` one-message batches from the start of a partition."""
    topic = f"facts.batches.{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, {topic: 1})
    p = _producer(bootstrap, **{"linger.ms": 0, "batch.num.messages": 1})
    for i in range(batches):
        p.produce(topic, b"x", partition=0)
        p.flush(5) if i % 500 == 0 else p.poll(0)
    p.flush(30)
    c = _consumer(bootstrap, **PROFILE, **{"fetch.wait.max.ms": wait_ms})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    read, started = 0, time.monotonic()
    while read < batches and time.monotonic() - started < 120:
        for m in c.consume(1000, 0.5):
            if m.error() is None:
                read += 1
    took = time.monotonic() - started
    c.close()
    return {"batches": batches, "fetch_wait_ms": wait_ms, "read": read, "seconds": round(took, 3)}


def auto_create(bootstrap: str) -> int:
    topic = f"facts.auto.{uuid.uuid4().hex[:6]}"
    p = _producer(bootstrap)
    p.produce(topic, b"x")
    p.flush(10)
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return len(md.topics[topic].partitions)


def deleted_topic(bootstrap: str) -> dict[str, Any]:
    """Produce to a topic that was deleted: acknowledged or refused, and readable afterwards?"""
    topic = f"facts.deleted.{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, {topic: 1})
    p = _producer(bootstrap, **{"linger.ms": 0})
    p.produce(topic, b"before", partition=0)
    p.flush(10)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_topics([topic], operation_timeout=10).values():
        f.result()
    results: list[str] = []
    for i in range(20):
        p.produce(topic, f"after-{i}".encode(), partition=0,
                  on_delivery=lambda err, _m: results.append("ok" if err is None else err.name()))
    p.flush(30)
    c = _consumer(bootstrap, **PROFILE)
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    found, deadline = 0, time.monotonic() + 5
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None and m.value().startswith(b"after"):
            found += 1
    c.close()
    return {"produced_after_delete": 20, "acknowledged": results.count("ok"),
            "errors": sorted(set(r for r in results if r != "ok")), "readable_afterwards": found}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/broker_facts.json"))
    ap.add_argument("--quick", action="store_true", help="shorter runs (for the test suite)")
    args = ap.parse_args(argv)
    seconds = 3.0 if args.quick else 20.0
    facts: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "loadavg_before": os.getloadavg()}
    with EmbeddedBroker() as broker:
        bs = broker.bootstrap_servers
        facts["broker"] = getattr(broker, "version", None)
        facts["group_join_s"] = {"profile (session 2 s)": round(group_join(bs, **PROFILE), 2)}
        if not args.quick:
            facts["group_join_s"]["librdkafka default (session 45 s)"] = round(group_join(bs), 2)
        facts["latest_offsets"] = latest_offsets(bs, 2000 if args.quick else 20000)
        facts["latency_ms_by_fetch_wait"] = {str(w): fetch_latency(bs, w, seconds)
                                             for w in ((5, 50) if args.quick else (5, 25, 50, 500))}
        facts["many_tiny_batches"] = [many_batches(bs, 2000 if args.quick else 20000, w)
                                      for w in ((5,) if args.quick else (5, 50))]
        facts["auto_created_partitions"] = auto_create(bs)
        facts["deleted_topic"] = deleted_topic(bs)
    facts["loadavg_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(facts, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(facts, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
