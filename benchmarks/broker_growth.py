"""How the embedded broker slows as it fills, and which client-side levers change it.

    python -m benchmarks.broker_growth                               # every variant, 1.2 M messages each
    python -m benchmarks.broker_growth --variants 4p-linger25 1p-linger25 --messages 600000
    python -m benchmarks.broker_growth --out benchmarks/results/<date>/broker-growth.json

Each variant starts a fresh embedded broker and offers Chronos's traffic shape without Chronos:
`--rate` msg/s of 100-byte messages to an "input" topic and the same to an "output" topic (what a
consumer and a firer write), each read at its head by a consumer (fetch.wait.max.ms 25, like the
embedded profile), and a probe topic of one partition that gets one message every 50 ms and is read
at its head (fetch.wait.max.ms 10). Every `--every` seconds it records the messages the broker holds,
the produce requests (batches) it took, its RSS and CPU, and the probe's produce->consume p50/p99.9
over that window. The variants differ in the partitions of the two topics and the producers'
linger.ms, which set how many batches the broker stores per message.

The figures answer: does the broker's cost grow with the messages it holds, or with the batches?
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.harness.procstat import cpu_seconds, rss_mb
from kits.figures import percentiles
from chronos.adapters.kafka.admin import create_topics
from chronos.embedded.broker import EmbeddedBroker
from chronos.embedded.procs import proc_stat

VARIANTS = {  # name -> (partitions of input and output, linger.ms of their producers)
    "4p-linger25": (4, 25),
    "1p-linger25": (1, 25),
    "4p-linger100": (4, 100),
    "4p-linger5": (4, 5),
}
PAYLOAD = b"x" * 100


class Load(threading.Thread):
    """`rate` msg/s to `topic` with `linger_ms`; counts acknowledged messages and produce requests."""

    def __init__(self, bootstrap: str, topic: str, rate: float, linger_ms: int, stop: threading.Event):
        super().__init__(daemon=True, name=f"load-{topic}")
        self.topic, self.rate, self.stop = topic, rate, stop
        self.acked = 0
        self.requests = 0
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "acks": "all",
                                  "enable.idempotence": "true", "statistics.interval.ms": 1000,
                                  "stats_cb": self.on_stats})

    def on_stats(self, raw: str) -> None:
        stats = orjson.loads(raw)
        self.requests = sum(b.get("req", {}).get("Produce", 0) for b in stats.get("brokers", {}).values())

    def on_delivery(self, err, _msg) -> None:
        if err is None:
            self.acked += 1

    def run(self) -> None:
        started, sent, i = time.time(), 0, 0
        while not self.stop.is_set():
            due = int((time.time() - started) * self.rate)
            while sent < due:
                try:
                    self.producer.produce(self.topic, PAYLOAD, b"%d" % (i % 1024), on_delivery=self.on_delivery)
                    sent += 1
                    i += 1
                except BufferError:
                    self.producer.poll(0.01)
            self.producer.poll(0.005)
        self.producer.flush(10)


class Head(threading.Thread):
    """Reads a topic at its head, as Chronos's consumer and an application's reader do."""

    def __init__(self, bootstrap: str, topic: str, fetch_wait_ms: int, stop: threading.Event):
        super().__init__(daemon=True, name=f"head-{topic}")
        self.stop = stop
        self.read = 0
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"growth-{uuid.uuid4().hex[:8]}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                                  "fetch.wait.max.ms": str(fetch_wait_ms), "session.timeout.ms": "2000",
                                  "heartbeat.interval.ms": "500"})
        self.consumer.subscribe([topic])

    def run(self) -> None:
        while not self.stop.is_set():
            self.read += len(self.consumer.consume(num_messages=10000, timeout=0.1))
        self.consumer.close()


class Probe(threading.Thread):
    """One message every `interval` s to a one-partition topic, read at its head: produce->consume."""

    def __init__(self, bootstrap: str, topic: str, stop: threading.Event, interval: float = 0.05):
        super().__init__(daemon=True, name="probe")
        self.stop, self.interval, self.topic = stop, interval, topic
        self.samples: list[tuple[float, float]] = []  # (sent at, latency s)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": "false", "fetch.wait.max.ms": "10"})
        self.consumer.assign([TopicPartition(topic, 0, 0)])

    def run(self) -> None:
        reader = threading.Thread(target=self.read, daemon=True)
        reader.start()
        while not self.stop.wait(self.interval):
            self.producer.produce(self.topic, b"%.6f" % time.time())
            self.producer.poll(0)
        reader.join(5)
        self.consumer.close()

    def read(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(num_messages=100, timeout=0.1):
                if msg.error() is None:
                    sent = float(msg.value())
                    self.samples.append((sent, time.time() - sent))


def run_variant(name: str, partitions: int, linger_ms: int, rate: float, messages: int, every: float) -> dict:
    broker = EmbeddedBroker()
    broker.start()
    bs = broker.bootstrap_servers
    stop = threading.Event()
    try:
        create_topics(bs, {"input": partitions, "output": partitions, "probe": 1})
        loads = [Load(bs, t, rate, linger_ms, stop) for t in ("input", "output")]
        heads = [Head(bs, t, 25, stop) for t in ("input", "output")]
        probe = Probe(bs, "probe", stop)
        for t in (*heads, probe, *loads):
            t.start()
        rows = []
        started = time.time()
        cpu0, t_prev, cpu_prev = cpu_seconds(broker.pid), started, cpu_seconds(broker.pid)
        print(f"{name}: {partitions} partitions, linger {linger_ms} ms, {rate:g} msg/s to each of two topics", flush=True)
        while True:
            time.sleep(every)
            now, cpu = time.time(), cpu_seconds(broker.pid)
            held = sum(load.acked for load in loads)
            window = [lat for sent, lat in probe.samples if sent >= t_prev - 0.5]
            p = percentiles([x * 1000 for x in window]) or {}
            row = {"t_s": round(now - started, 1), "messages": held,
                   "batches": sum(load.requests for load in loads),
                   "rss_mb": rss_mb(broker.pid),
                   "broker_cpu": round((cpu - cpu_prev) / (now - t_prev), 3),
                   "probe_p50_ms": p.get("p50"), "probe_p999_ms": p.get("p999"),
                   "read": sum(h.read for h in heads)}
            rows.append(row)
            print("  " + "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            t_prev, cpu_prev = now, cpu
            if held >= messages or proc_stat(broker.pid) is None:
                break
        return {"variant": name, "partitions": partitions, "linger_ms": linger_ms, "rate_per_topic": rate,
                "broker_cpu_s": round(cpu_seconds(broker.pid) - cpu0, 1), "rows": rows}
    finally:
        stop.set()
        time.sleep(0.5)
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--rate", type=float, default=2000.0, help="msg/s to each of the two topics (default 2000)")
    parser.add_argument("--messages", type=int, default=1_200_000, help="stop a variant once the broker holds this many")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between rows (default 10)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = {"benchmark": "broker_growth", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "loadavg_before": list(os.getloadavg()), "variants": []}
    for name in args.variants:
        partitions, linger = VARIANTS[name]
        results["variants"].append(run_variant(name, partitions, linger, args.rate, args.messages, args.every))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
