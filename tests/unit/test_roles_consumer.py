"""The consumer's loop, built with its adapters as arguments: a store double and a Kafka double."""

from __future__ import annotations

import re
import uuid

from chronos.domain.intake import Rules
from chronos.errors import StoreRejected
from chronos.ops.metrics import ConsumerTelemetry
from chronos.roles.consumer import ConsumerProcess, sort_batch
from chronos.runtime.process import Lifecycle
from kafka_double import FakePublisher, settings

NOW = 1_800_000_000_000_000
RULES = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile("out"))


class FakeMessage:
    """Stands in for confluent_kafka.Message."""

    def __init__(self, headers, key=b"k", value=b"v", offset=0, partition=0, topic="in"):
        self._h, self._k, self._v, self._o, self._p, self._t = headers, key, value, offset, partition, topic

    def headers(self): return self._h
    def key(self): return self._k
    def value(self): return self._v
    def offset(self): return self._o
    def partition(self): return self._p
    def topic(self): return self._t
    def error(self): return None


class FakeConsumer:
    def __init__(self, on_commit):
        self.on_commit = on_commit
        self.commits: list = []

    def commit(self, *, offsets, asynchronous=True):
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})


def consumer(store, publisher=None, **env) -> ConsumerProcess:
    s = settings(**env)
    return ConsumerProcess(s, Lifecycle(), store=store, producers=(publisher or FakePublisher()).factory(),
                           consumers=lambda on_commit: (FakeConsumer(on_commit), None),
                           telemetry=ConsumerTelemetry(uuid.uuid4(), s))


def hdrs(mid, deadline_ms):
    return [("chronosMessageId", mid.encode()), ("chronosDeadline", str(deadline_ms).encode())]


def test_rows_postgres_refuses_are_dead_lettered_one_by_one():
    class RefusingStore:
        def apply(self, inserts, replaces, cancels):
            if any(r.id == "poison" for r in inserts):
                raise StoreRejected("invalid byte sequence")
            return len(inserts), len(replaces), len(cancels), 0

    now_ms = NOW // 1000
    msgs = [FakeMessage(hdrs("good", now_ms + 60_000)), FakeMessage(hdrs("poison", now_ms + 60_000))]
    batch = sort_batch(msgs, NOW, RULES)
    proc = consumer(RefusingStore())
    assert proc.apply_one_by_one(batch, StoreRejected("x")) == (1, 0, 0, 0)
    assert list(batch.rows) == ["good"]
    assert [(h[0][1], r.split(":")[0]) for _, r, h in batch.dead] == [(b"poison", "store_rejected")]
