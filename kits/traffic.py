"""Traffic for the fault tests and benchmarks: a steady load on the input topic, a reader of the output
topic, and what the store and the consumer group hold meanwhile.

- `Load` produces a steady rate of messages from a thread (mixed delays, some already late); only
  messages the broker acknowledged count as sent.
- `Reader` reads the output topic from a thread and stamps every arrival with the local clock, the
  process's cyclic garbage collector off meanwhile (`CollectorOff`); `reread` reads a topic again from
  the start, to tell a message never published from one the reader missed.
- `held_rows` (rows a firer holds) and `OffsetWatcher` (a group's committed offsets) say what was in
  flight when a fault began.
"""

from __future__ import annotations

import gc
import random
import threading
import time
import uuid
from dataclasses import dataclass

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS as EMBEDDED_KAFKA

# -- the store -------------------------------------------------------------------------------


# A row a firer holds: stamped as claimed (readied_at, readied_by), or taken by its claim that deletes (deleted by
# a transaction of the firer's still open: the row's xmax is that transaction's, pg_stat_activity names the firer,
# and the transaction's start is the claim's time).
HELD = ("SELECT m.id, extract(epoch FROM coalesce(m.readied_at, a.xact_start))::float8, "
        "coalesce(m.readied_by::text, split_part(a.application_name, ' ', 3)) "
        "FROM chronos_messages AS m LEFT JOIN pg_stat_activity AS a "
        "ON a.backend_xid = m.xmax AND a.application_name LIKE 'chronos firer %' "
        "WHERE m.readied_at IS NOT NULL OR a.pid IS NOT NULL")


def held_rows(database_url: str, node: str | None = None) -> dict[str, float]:
    """Rows a firer holds right now (stamped as claimed, or taken by its claim that deletes), by `node` or by
    anyone: id -> when it was claimed (epoch s)."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        return {mid: at for mid, at, by in conn.execute(HELD).fetchall() if node is None or by == str(node)}


def still_stored(database_url: str, ids: set[str]) -> set[str]:
    """Which of `ids` are still waiting in the store."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        return {mid for (mid,) in conn.execute("SELECT id FROM chronos_messages WHERE id = ANY(%s)", [list(ids)])}


# -- load and reader --------------------------------------------------------------------------


@dataclass
class Sent:
    deadline: float          # epoch s (ms precision, as sent)
    produced: float          # local time the message was handed to the producer
    partition: int = -1
    offset: int = -1

    @property
    def due(self) -> float:
        """When it may first be delivered: its deadline, or when it was sent if already late."""
        return max(self.deadline, self.produced)


def _iso(epoch_ms: int) -> bytes:
    t = time.gmtime(epoch_ms // 1000)
    return (time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{epoch_ms % 1000:03d}Z").encode()


class Load(threading.Thread):
    """Produces `rate` messages per second to the input topic until stopped.

    Deadlines are `now + uniform(*delays)`, or for a `late` fraction up to 3 s in the past;
    half are ISO-8601, half epoch milliseconds. Each message's value is its id.
    """

    def __init__(self, bootstrap: str, topic: str, rate: float = 500, delays: tuple[float, float] = (0.5, 5.0),
                 late: float = 0.1, seed: int | None = None, linger_ms: int = 5):
        super().__init__(daemon=True, name="load")
        self.topic, self.rate, self.delays, self.late = topic, rate, delays, late
        self.random = random.Random(seed)
        self.run_id = uuid.uuid4().hex[:6]
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "acks": "all",
                                  "enable.idempotence": "true"})
        self.pending: dict[str, Sent] = {}
        self.sent: dict[str, Sent] = {}       # acknowledged by the broker
        self.failed: dict[str, str] = {}
        self._halt = threading.Event()
        self.seq = 0

    def _delivered(self, err, msg) -> None:
        mid = msg.value().decode()
        rec = self.pending.pop(mid)
        if err is not None:
            self.failed[mid] = err.str()
            return
        rec.partition, rec.offset = msg.partition(), msg.offset()
        self.sent[mid] = rec

    def send_one(self, now: float) -> None:
        self.seq += 1
        mid = f"{self.run_id}-{self.seq}"
        if self.random.random() < self.late:
            deadline = now - self.random.uniform(0.0, 3.0)
        else:
            deadline = now + self.random.uniform(*self.delays)
        ms = int(deadline * 1000)
        raw = _iso(ms) if self.seq % 2 else str(ms).encode()
        self.pending[mid] = Sent(ms / 1000.0, now)
        headers = [("chronosMessageId", mid.encode()), ("chronosDeadline", raw), ("seq", str(self.seq).encode())]
        while True:
            try:
                self.producer.produce(self.topic, mid.encode(), f"k{self.seq % 64}".encode(), headers=headers,
                                      on_delivery=self._delivered)
                return
            except BufferError:
                self.producer.poll(0.05)

    def run(self) -> None:
        started = time.time()
        while not self._halt.is_set():
            now = time.time()
            due = int((now - started) * self.rate)
            while self.seq < due:
                self.send_one(time.time())
            self.producer.poll(0)
            time.sleep(0.005)

    def stop(self, flush_timeout: float = 60.0) -> None:
        self._halt.set()
        self.join(10)
        left = self.producer.flush(flush_timeout)
        assert left == 0, f"{left} messages of the load were never acknowledged by the broker"

    @property
    def last_due(self) -> float:
        return max((s.due for s in self.sent.values()), default=time.time())


class CollectorOff:
    """The process's cyclic garbage collector off while any reader measures: a full collection walks every
    object the harness keeps per message (hundreds of thousands by a run's second minute), 100-360 ms each on
    this machine, and every read time waits for it, reported as Chronos's lateness. What the harness keeps
    makes no cycles to speak of. On again (if it was) once the last reader stops."""

    _lock = threading.Lock()
    _readers = 0
    _was_on = False

    @classmethod
    def enter(cls) -> None:
        with cls._lock:
            if cls._readers == 0:
                cls._was_on = gc.isenabled()
                gc.disable()
            cls._readers += 1

    @classmethod
    def leave(cls) -> None:
        with cls._lock:
            cls._readers -= 1
            if cls._readers == 0 and cls._was_on:
                gc.enable()


class Reader(threading.Thread):
    """Reads the output topic from the beginning; arrivals[id] = local read times, the process's garbage
    collector off meanwhile (`CollectorOff`) unless `collect_garbage`.

    A record read twice (the reader's own group rebalanced and read again from the last
    position it knew, e.g. after the broker was paused) counts once: deliveries are told apart
    by their (partition, offset).
    """

    def __init__(self, bootstrap: str, topic: str, fetch_wait_ms: int = 10, collect_garbage: bool = False):
        super().__init__(daemon=True, name="reader")
        self.bootstrap, self.topic, self.collect_garbage = bootstrap, topic, collect_garbage
        self.found_on_reread: set[str] = set()  # missed by this reader, found on the topic by `reread`
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                                  "fetch.wait.max.ms": str(fetch_wait_ms), **EMBEDDED_KAFKA})
        self.consumer.subscribe([topic])
        self.arrivals: dict[str, list[float]] = {}
        self.created: dict[str, float] = {}  # first delivery's CreateTime: when the publisher produced it
        self.create_times: dict[str, list[float]] = {}  # every delivery's CreateTime, in arrival order
        self.seen: set[tuple[int, int]] = set()
        self.assigned = threading.Event()
        self._halt = threading.Event()

    def run(self) -> None:
        if not self.collect_garbage:
            CollectorOff.enter()
        try:
            while not self._halt.is_set():
                msgs = self.consumer.consume(num_messages=2000, timeout=0.05)
                at = time.time()
                if self.consumer.assignment():
                    self.assigned.set()
                for msg in msgs:
                    if msg.error() is None and msg.value() is not None \
                            and (msg.partition(), msg.offset()) not in self.seen:
                        self.seen.add((msg.partition(), msg.offset()))
                        self.created.setdefault(msg.value().decode(errors="replace"), msg.timestamp()[1] / 1000.0)
                        self.create_times.setdefault(msg.value().decode(errors="replace"), []).append(
                            msg.timestamp()[1] / 1000.0)
                        self.arrivals.setdefault(msg.value().decode(errors="replace"), []).append(at)
        finally:
            self.consumer.close()
            if not self.collect_garbage:
                CollectorOff.leave()

    def wait_assigned(self, timeout: float = 30.0) -> None:
        assert self.assigned.wait(timeout), "the reader got no partitions"

    def wait_for(self, ids, timeout: float) -> set[str]:
        """Wait until every id has arrived; returns the missing ones (empty on success)."""
        end = time.monotonic() + timeout
        missing = set(ids)
        while time.monotonic() < end:
            missing = {m for m in missing if m not in self.arrivals}
            if not missing:
                break
            time.sleep(0.2)
        return missing

    def missing(self, ids, timeout: float) -> set[str]:
        """Wait until every id has arrived; read the topic again from its start for those that did not (a reader at
        the head of a topic of the embedded broker, with fetches of a few milliseconds, has been seen to skip a few
        messages that are on it: the topic decides, not this reader). Returns the ids not on the topic even then;
        `found_on_reread` keeps the others, which have no `arrivals`."""
        missed = self.wait_for(ids, timeout)
        return missed - self.reread(missed) if missed else missed

    def reread(self, ids: set[str]) -> set[str]:
        """Which of `ids` (missed by this reader) are on its topic, read again from the start by a fresh consumer
        (`reread`); kept in `found_on_reread`."""
        found = reread(self.bootstrap, self.topic, ids)
        self.found_on_reread |= found
        return found

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def reread(bootstrap: str, topic: str, wanted: set[str], quiet_s: float = 5.0, timeout: float = 120.0) -> set[str]:
    """Which of `wanted` a fresh consumer finds on `topic`, reading it all again from the beginning:
    tells a message Chronos never published from one the reader missed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reread-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                         "fetch.wait.max.ms": "100", **EMBEDDED_KAFKA})
    consumer.subscribe([topic])
    found: set[str] = set()
    started = last = time.monotonic()
    try:
        while found != wanted and time.monotonic() - last < quiet_s and time.monotonic() - started < timeout:
            msgs = consumer.consume(num_messages=5000, timeout=0.5)
            if msgs:
                last = time.monotonic()
            for msg in msgs:
                if msg.error() is None and msg.value() is not None:
                    value = msg.value().decode(errors="replace")
                    if value in wanted:
                        found.add(value)
    finally:
        consumer.close()
    return found


class OffsetWatcher:
    """Reads a consumer group's committed offsets quickly (the coordinator is looked up once)."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int):
        self.topic, self.partitions = topic, partitions
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "enable.auto.commit": "false", **EMBEDDED_KAFKA})
        self.committed()

    def committed(self) -> dict[int, int]:
        tps = self.consumer.committed([TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}

    def close(self) -> None:
        self.consumer.close()
