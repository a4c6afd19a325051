"""Where is each message a benchmark sent and never saw delivered? Looked up in the store and the topics.

A benchmark's reader may miss a message for many reasons besides a loss: it is still waiting for a
retry, a firer holds it, it was parked or dead-lettered, the consumer has not read it yet, or it was
delivered and the live reader missed it. `account` asks each place in turn and sorts every
undelivered id into the first that knows it:

- delivered_after_all: on an output topic when read again from the beginning;
- waiting: in chronos_messages, unclaimed (with its attempts, last error and next attempt);
- held: in chronos_messages, claimed by a firer (which node, since when);
- parked: in chronos_parked (with the reason);
- dead_lettered: on the dead-letter topic (with its chronosError);
- not_consumed: on the input topic at or past the consumer group's committed offset;
- consumed_and_gone: on the input topic before the committed offset and nowhere else: a real loss;
- not_on_input: acknowledged to the load producer but not on the input topic (the broker lost it).

Benchmarks identify their messages by the `bench-run` and `bench-id` headers (benchmarks/harness/kafka_load.py);
the chronosMessageId is `<run>-<id>`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterable

import psycopg

STATES = ("delivered_after_all", "waiting", "held", "parked", "dead_lettered", "not_consumed", "consumed_and_gone",
          "not_on_input")
EXAMPLES = 5


def scan(bootstrap: str, topic: str, wanted: set[bytes], conf: dict | None = None,
         idle_s: float = 30.0) -> dict[bytes, tuple[int, int, str | None]]:
    """Read `topic` from the beginning to its end: the messages whose chronosMessageId is in `wanted`,
    as id -> (partition, offset, chronosError or None). A message without one (on an output topic:
    Chronos relays no chronos header) is known by its benchmark headers, as `<bench-run>-<bench-id>`.

    The end is each partition's high watermark as the fetches report it (the embedded broker's
    ListOffsets answer is short of the true end), reached with a second's quiet; a broker that
    serves nothing for `idle_s` ends the scan where it is. Its fetches may wait 5 s: a reader at the
    head with a short wait (the benchmarks' reader waits 5 ms) can stop getting anything from the
    embedded broker once a partition holds enough batches (docs/operations/embedded-stack.md)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    # a long fetch wait: the embedded broker stops listing a partition's batches when the wait runs out,
    # and a reader whose position lies past what it lists in that time gets nothing at all
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chronos-accounting-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": "false", **(conf or {}), "fetch.wait.max.ms": "5000"})
    found: dict[bytes, tuple[int, int, str | None]] = {}
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return found
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        consumer.assign(partitions)
        position = {p: 0 for p in meta.partitions}
        quiet_since = time.monotonic()
        while True:
            batch = consumer.consume(num_messages=10000, timeout=0.5)
            now = time.monotonic()
            if batch:
                quiet_since = now
            for msg in batch:
                if msg.error() is not None:
                    continue
                position[msg.partition()] = msg.offset() + 1
                headers = dict(msg.headers() or ())
                mid = headers.get("chronosMessageId")
                if mid is None and "bench-run" in headers:  # Chronos relays no chronos header to the output
                    mid = b"%s-%s" % (headers["bench-run"], headers.get("bench-id") or b"")
                if mid in wanted:
                    error = headers.get("chronosError")
                    found[mid] = (msg.partition(), msg.offset(), error.decode(errors="replace") if error else None)
            ends = [consumer.get_watermark_offsets(tp, cached=True)[1] for tp in partitions]
            at_end = all(0 <= end <= position[tp.partition] for tp, end in zip(partitions, ends))  # -1001: no fetch yet
            if (at_end and now - quiet_since >= 1.0) or now - quiet_since >= idle_s:
                return found
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str, partitions: Iterable[int], conf: dict | None = None) -> dict[int, int]:
    """The consumer group's committed offset of each partition (-1: none), without joining the group."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": "false",
                         **(conf or {})})
    try:
        return {tp.partition: tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in partitions],
                                                                      timeout=10)}
    finally:
        consumer.close()


def account(ids: list[str], *, database_url: str, bootstrap: str, input_topic: str, output_topics: list[str],
            dlq_topic: str, consumer_group: str, conf: dict | None = None) -> dict:
    """Sort the undelivered message ids into the states above: counts, and a few examples of each."""
    states: dict[str, str] = {}
    detail: dict[str, str] = {}
    if ids:
        wanted = {i.encode() for i in ids}
        for topic in output_topics:
            for mid in scan(bootstrap, topic, wanted, conf):
                states.setdefault(mid.decode(), "delivered_after_all")
        left = [i for i in ids if i not in states]
        with psycopg.connect(database_url) as conn:
            for mid, deadline, readied_at, readied_by, attempts, error in conn.execute(
                    "SELECT id, deadline, readied_at, readied_by, attempts, last_error FROM chronos_messages "
                    "WHERE id = ANY(%s)", (left,)):
                if readied_at is None:
                    states[mid] = "waiting"
                    detail[mid] = f"due {deadline.isoformat()}, {attempts} failed publishes" + \
                        (f", last: {error}" if error else "")
                else:
                    states[mid] = "held"
                    detail[mid] = f"claimed by {readied_by} at {readied_at.isoformat()}, due {deadline.isoformat()}"
            left = [i for i in ids if i not in states]
            for mid, reason in conn.execute("SELECT message_id, reason FROM chronos_parked WHERE message_id = ANY(%s)",
                                            (left,)):
                states[mid], detail[mid] = "parked", reason
        left = [i for i in ids if i not in states]
        if left:
            for mid, (_, _, error) in scan(bootstrap, dlq_topic, {i.encode() for i in left}, conf).items():
                states[mid.decode()], detail[mid.decode()] = "dead_lettered", error or ""
        left = [i for i in ids if i not in states]
        if left:
            on_input = scan(bootstrap, input_topic, {i.encode() for i in left}, conf)
            marks = committed(bootstrap, consumer_group, input_topic, {p for p, _, _ in on_input.values()}, conf)
            for mid in left:
                where = on_input.get(mid.encode())
                if where is None:
                    states[mid] = "not_on_input"
                    continue
                partition, offset, _ = where
                mark = marks.get(partition, -1)
                states[mid] = "not_consumed" if mark < 0 or offset >= mark else "consumed_and_gone"
                detail[mid] = f"{input_topic}[{partition}]@{offset}, committed offset {mark}"
    counts = Counter(states.values())
    examples: dict[str, list[str]] = {}
    for mid in ids:
        state = states[mid]
        if len(examples.setdefault(state, [])) < EXAMPLES:
            examples[state].append(f"{mid}: {detail[mid]}" if mid in detail else mid)
    return {"undelivered": len(ids), "by_state": {s: counts[s] for s in STATES if counts[s]}, "examples": examples,
            "explained": counts["consumed_and_gone"] + counts["not_on_input"] == 0}


def undelivered_ids(rec, tag: str) -> list[str]:
    """The chronosMessageIds of a run's messages acknowledged on the input and not delivered (`rec`:
    benchmarks.harness.records.Records, filled by kafka_load's producer and reader)."""
    import numpy as np

    from benchmarks.harness.records import ACKED

    n = int(rec.get("sent"))
    lost = (rec.state[:n] == ACKED) & np.isnan(rec.delivered_at[:n])
    return [f"{tag}-{i}" for i in np.flatnonzero(lost)]


def account_stack(ids: list[str], info: dict) -> dict:
    """`account` against a `chronos up` stack, from its ready file's facts (`info`). When some are not
    explained, the stack's logs are copied aside first (the stack's directory goes when it stops)."""
    accounted = account(ids, database_url=info["database_url"], bootstrap=info["bootstrap_servers"],
                        input_topic=info["input_topic"], output_topics=[info["output_topic"]],
                        dlq_topic=info["dlq_topic"], consumer_group=info.get("consumer_group") or "chronos",
                        conf=info.get("kafka_properties") or {})
    if not accounted["explained"] and info.get("log_dir"):
        kept = Path(tempfile.mkdtemp(prefix="chronos-unexplained-"))
        shutil.copytree(info["log_dir"], kept / "logs")
        accounted["logs_kept_in"] = str(kept / "logs")
    return accounted


def render(accounted: dict) -> str:
    """One line per state: how many, and the first examples."""
    if not accounted["undelivered"]:
        return "every message was delivered"
    lines = [f"{accounted['undelivered']} undelivered: "
             + ", ".join(f"{n} {state}" for state, n in accounted["by_state"].items())
             + (f" (the stack's logs are kept in {accounted['logs_kept_in']})" if "logs_kept_in" in accounted else "")]
    for state, examples in accounted["examples"].items():
        lines.append(f"  {state}: " + "; ".join(examples))
    return "\n".join(lines)
