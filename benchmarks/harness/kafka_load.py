"""The Kafka side of the harness: the load producer, the output reader and the broker-floor probe.

Each function here is the body of its own OS process (multiprocessing, spawn), so the load
generator, the measuring reader and the probe never share an interpreter (or a GIL) with each
other or with the orchestrator.

Message identity: every message carries the headers `bench-run` (this step's tag), `bench-id`
(its sequence number) and `bench-deadline-us`; Chronos relays them untouched. The key is the
sequence number too, so the producer's delivery callback finds the slot without parsing headers.
"""

from __future__ import annotations

import math
import random
import signal
import struct
import threading
import time
from dataclasses import dataclass

from benchmarks.harness.records import ACKED, FAILED, SENT, Records
from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS

# Per docs/operations/embedded-stack.md: short group timeouts for the embedded broker; the output reader stays at the
# head of the log, so it may use a small fetch.wait.max.ms (its latency follows that setting).
READER_DEFAULTS = {
    **EMBEDDED_GROUP_TIMEOUTS,
    "enable.auto.commit": "false",
    "enable.partition.eof": "false",
    "auto.offset.reset": "earliest",
}
# What an application producing delayed messages (and Chronos's firer) would use.
PRODUCER_DEFAULTS = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "queue.buffering.max.messages": "1000000",
}


def quiet_interrupts() -> None:
    """Children ignore Ctrl-C: the orchestrator stops them through their stop event."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def client_configs(bootstrap: str, properties: dict, fetch_wait_ms: int, linger_ms: int) -> tuple[dict, dict]:
    """(producer, consumer) configurations: the stack's extra properties plus the harness's settings."""
    from chronos.adapters.kafka.clients import CONSUMER_ONLY, PRODUCER_ONLY
    base = {"bootstrap.servers": bootstrap}
    producer = {**PRODUCER_DEFAULTS, **{k: v for k, v in properties.items() if k not in CONSUMER_ONLY}, **base,
                "linger.ms": str(linger_ms)}
    consumer = {**READER_DEFAULTS, **{k: v for k, v in properties.items() if k not in PRODUCER_ONLY}, **base,
                "fetch.wait.max.ms": str(fetch_wait_ms)}
    return producer, consumer


@dataclass(frozen=True)
class LoadPlan:
    """What one step offers: `count` messages at `rate`/s from `t0`, deadlines send time + uniform delay."""

    tag: str
    rate: float
    count: int
    t0: float
    delay_min: float
    delay_max: float
    payload_bytes: int
    seed: int
    # every deadline at this instant (epoch seconds) instead of send time + delay: a spike
    deadline_at: float | None = None


def take_due(plan: LoadPlan, rec: Records, rng: random.Random, sent: int) -> tuple[range, list[float]]:
    """For a peer's producer (one batched enqueue per tick): the messages of `plan` due by now after
    the first `sent`, and their deadlines (send time + delay, at millisecond precision), each one
    recorded as sent now."""
    due = max(sent, min(plan.count, int((time.time() - plan.t0) * plan.rate) + 1))
    ids = range(sent, due)
    deadline, sent_at, state = rec.raw["deadline"], rec.raw["sent_at"], rec.raw["state"]
    dmin, dspan = plan.delay_min, plan.delay_max - plan.delay_min
    targets = []
    for k in ids:
        t = time.time()
        target = int((t + dmin + rng.random() * dspan) * 1000) / 1000.0
        deadline[k], sent_at[k], state[k] = target, t, SENT
        targets.append(target)
    if ids:
        rec.set("sent", due)
    return ids, targets


def run_producer(conf: dict, topic: str, plan: LoadPlan, rec: Records, stop=None) -> None:
    """Offer the load: each message is produced at t0 + i/rate (in bursts of at most a millisecond's worth).

    With a `stop` event, producing ends early when it is set (what was produced is still flushed).
    """
    from confluent_kafka import Producer

    quiet_interrupts()
    producer = Producer(conf)
    rng = random.Random(plan.seed)
    payload = random.Random(plan.seed + 1).randbytes(plan.payload_bytes)
    tag = plan.tag.encode()
    deadline, sent_at, state = rec.raw["deadline"], rec.raw["sent_at"], rec.raw["state"]
    counts = {"acked": 0, "failed": 0}

    def on_delivery(err, msg) -> None:
        i = int(msg.key())
        if err is None:
            state[i] = ACKED
            counts["acked"] += 1
        else:
            state[i] = FAILED
            counts["failed"] += 1

    def publish_counts() -> None:
        rec.set("acked", counts["acked"])
        rec.set("failed", counts["failed"])

    n, rate, t0 = plan.count, plan.rate, plan.t0
    dmin, dspan = plan.delay_min, plan.delay_max - plan.delay_min
    fixed_ms = int(plan.deadline_at * 1000) if plan.deadline_at is not None else None
    i = 0
    while time.time() < t0:
        time.sleep(min(0.01, max(0.0, t0 - time.time())))
    rec.set("t_first", time.time())
    while i < n and not (stop is not None and stop.is_set()):
        now = time.time()
        due = min(n, int((now - t0) * rate) + 1)
        while i < due:
            t = time.time()
            deadline_ms = fixed_ms if fixed_ms is not None else int((t + dmin + rng.random() * dspan) * 1000)
            key = b"%d" % i
            headers = [("chronosMessageId", b"%s-%d" % (tag, i)), ("chronosDeadline", b"%d" % deadline_ms),
                       ("bench-run", tag), ("bench-id", key), ("bench-deadline-us", b"%d" % (deadline_ms * 1000))]
            while True:
                try:
                    producer.produce(topic, payload, key, headers=headers, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
            deadline[i] = deadline_ms / 1000.0
            sent_at[i] = t
            state[i] = SENT
            i += 1
        rec.set("sent", i)
        producer.poll(0)
        publish_counts()
        if i < n:
            wait = t0 + i / rate - time.time()
            if wait > 0:
                # poll() counts whole milliseconds: a shorter wait would spin
                producer.poll(min(max(wait, 0.001), 0.01))
    rec.set("t_last", time.time())
    while producer.flush(1.0) > 0:
        publish_counts()
    publish_counts()
    rec.set("producer_done", 1.0)


def run_reader(conf: dict, topic: str, tag: str, rec: Records, ready, stop) -> None:
    """Read the output topic from its current end and stamp each of this step's messages on arrival.

    The receive time is taken once per batch of messages already in the client's queue, right
    after they were handed over, so it is an upper bound of when each became readable.
    """
    run_phases_reader(conf, topic, {tag: rec}, ready, stop)


def run_phases_reader(conf: dict, topic: str, runs: dict[str, Records], ready, stop) -> None:
    """`run_reader` for several runs at once (the phases of one benchmark): each message is stamped
    in the records of its `bench-run` tag; the counters are kept in each run's records."""
    from confluent_kafka import Consumer

    quiet_interrupts()
    # assign(), not subscribe(): no group join (docs/operations/embedded-stack.md, behaviour 1); the group id is
    # required all the same
    consumer = Consumer({**conf, "group.id": f"chronos-bench-{min(runs)}"})
    consumer.assign(_end_offsets(consumer, topic))
    consumer.poll(0.2)  # connect and start fetching before the load begins
    ready.set()
    slots = {tag.encode(): (rec, rec.raw["delivered_at"], rec.raw["created_at"], rec.raw["copies"], rec.capacity,
                            [0, 0, 0]) for tag, rec in runs.items()}   # counts: delivered, duplicates, foreign
    isnan = math.isnan
    while not stop.is_set():
        batch, now = _next_batch(consumer, 100000)
        for msg in batch:
            if msg.error() is not None:
                continue
            run = sid = None
            for k, v in msg.headers() or ():
                if k == "bench-run":
                    run = v
                elif k == "bench-id":
                    sid = v
            slot = slots.get(run)
            if slot is None or sid is None:
                continue
            _rec, delivered, created, copies, cap, counts = slot
            i = int(sid)
            if i >= cap:
                counts[2] += 1
                continue
            copies[i] += 1.0
            if isnan(delivered[i]):
                delivered[i] = now
                created[i] = msg.timestamp()[1] / 1000.0
                counts[0] += 1
            else:
                counts[1] += 1
        for rec, *_arrays, counts in slots.values():
            rec.set("delivered", counts[0])
            rec.set("duplicates", counts[1])
            rec.set("foreign", counts[2])
    consumer.close()


def _next_batch(consumer, most: int) -> tuple[list, float]:
    """The messages that came within 0.1 s and all the client had queued behind them (at most `most`),
    with the time they were handed over: one receive time per batch, an upper bound for each."""
    first = consumer.poll(0.1)
    if first is None:
        return [], time.time()
    batch = consumer.consume(most, 0)
    now = time.time()
    batch.insert(0, first)
    return batch, now


def _end_offsets(consumer, topic: str) -> list:
    """Every partition of `topic` at its high watermark.

    The embedded broker may report a high watermark a little short of the true end (docs/operations/embedded-stack.md,
    behaviour 2); that only means re-reading a few older messages, which the run tag filters out.
    """
    from confluent_kafka import TopicPartition
    md = consumer.list_topics(topic, timeout=10)
    out = []
    for p in sorted(md.topics[topic].partitions):
        _lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        out.append(TopicPartition(topic, p, max(hi, 0)))
    return out


def run_probe(producer_conf: dict, consumer_conf: dict, topic: str, interval: float, sent, latency, count,
              ready, stop) -> None:
    """The broker's own produce→consume latency, with the same client settings as the load.

    Produces a timestamped message every `interval` s and reads it back at the head of the log.
    `sent[k]` is when sample k was produced, `latency[k]` how long it took to become readable.
    """
    from confluent_kafka import Consumer, Producer

    quiet_interrupts()
    consumer = Consumer({**consumer_conf, "group.id": f"chronos-bench-{topic}"})
    consumer.assign(_end_offsets(consumer, topic))
    consumer.poll(0.2)
    producer = Producer(producer_conf)
    cap = len(latency)

    def read() -> None:
        while not stop.is_set():
            batch, now = _next_batch(consumer, 10000)
            for msg in batch:
                if msg.error() is not None or msg.value() is None or len(msg.value()) != 8:
                    continue
                k = int(count.value)
                if k < cap:
                    t = struct.unpack("!d", msg.value())[0]
                    sent[k] = t
                    latency[k] = now - t
                    count.value = k + 1

    reader = threading.Thread(target=read, name="probe-reader", daemon=True)
    reader.start()
    ready.set()
    next_send = time.time()
    while not stop.is_set():
        # poll() returns as soon as it served a delivery report: wait out the interval in a loop, or the
        # probe would send faster than asked, run ahead of its schedule, then fall silent for as long
        wait = next_send - time.time()
        if wait > 0:
            producer.poll(min(wait, 0.1))
            continue
        producer.produce(topic, struct.pack("!d", time.time()))
        producer.poll(0)
        next_send = max(next_send + interval, time.time())
    producer.flush(5)
    reader.join(5)
    consumer.close()
