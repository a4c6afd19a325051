"""The consumer's loop on the in-memory store and Kafka doubles: the batch's store operations,
late and invalid messages, and offsets committed only once their batch is durable."""

from __future__ import annotations

import re
import threading
import time
import uuid

from chronos import codec
from chronos.adapters.kafka.clients import OutageLog
from chronos.adapters.memory import MemoryDatabase, MemoryStore
from chronos.domain.intake import Rules
from chronos.domain.model import Row
from chronos.errors import StoreRejected
from chronos.ops.telemetry import ConsumerTelemetry
from chronos.roles.consumer import ConsumerProcess, sort_batch
from chronos.runtime.process import Lifecycle
from kafka_double import FakeMessage, FakePublisher, settings

NOW = 1_800_000_000_000_000
RULES = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile("out"))
TIMEOUT = 10.0




class FakeConsumer:
    """The input topic: `consume` hands out the batches given to `feed`, one per call; `commit`
    records the offsets and what `snapshot()` says at that moment."""

    def __init__(self, on_commit, snapshot=lambda: None):
        self.on_commit, self.snapshot = on_commit, snapshot
        self.batches: list[list[FakeMessage]] = []
        self.commits: list[tuple[dict, object]] = []
        self.lock = threading.Lock()

    def feed(self, messages):
        with self.lock:
            self.batches.append(messages)

    def subscribe(self, topics):
        self.topics = topics

    def consume(self, num_messages=1, timeout=-1):
        with self.lock:
            if self.batches:
                return self.batches.pop(0)
        time.sleep(timeout)  # as the client does when nothing is there
        return []

    def commit(self, *, offsets, asynchronous=True):
        with self.lock:
            self.commits.append(({(tp.topic, tp.partition): tp.offset for tp in offsets}, self.snapshot()))

    def close(self):
        pass


class Consumer:
    """A consumer process on an in-memory database, with its parts at hand."""

    def __init__(self, store=None, **env):
        self.db = MemoryDatabase()
        self.store = store or MemoryStore(self.db)
        self.publisher = FakePublisher()
        self.settings = settings(**env)
        self.life = Lifecycle()
        self.input: FakeConsumer | None = None

        def consumers(on_commit):
            self.input = FakeConsumer(on_commit, snapshot=lambda: sorted(self.db.rows))
            return self.input, OutageLog("test consumer")
        self.proc = ConsumerProcess(self.settings, self.life, store=self.store, producers=self.publisher.factory(),
                                    consumers=consumers, telemetry=ConsumerTelemetry(uuid.uuid4(), self.settings))


def hdrs(mid, deadline_ms, action=None):
    h = [("chronosMessageId", mid.encode())]
    if deadline_ms is not None:
        h.append(("chronosDeadline", str(deadline_ms).encode()))
    if action:
        h.append(("chronosAction", action.encode()))
    return h


def test_a_batch_schedules_replaces_and_cancels_each_id_as_its_messages_say_in_order():
    c = Consumer()
    now_ms = time.time_ns() // 1_000_000
    in_1h, in_2h = now_ms + 3_600_000, now_ms + 7_200_000
    MemoryStore(c.db).apply([Row(i, in_1h * 1000, None, b"k", b"old", codec.encode_headers([]))
                             for i in ("waiting", "to cancel", "waiting late")], [], [])
    messages = [FakeMessage(h, value=mid.encode() + b"@" + str(i).encode(), offset=i) for i, (mid, h) in enumerate([
        ("waiting", hdrs("waiting", in_2h, "replace")),     # replaces the stored version
        ("to cancel", hdrs("to cancel", None, "cancel")),
        ("new", hdrs("new", in_1h)), ("new", hdrs("new", None, "cancel")),  # scheduled then cancelled
        ("back", hdrs("back", None, "cancel")), ("back", hdrs("back", in_2h)),  # cancelled then scheduled
        ("dup", hdrs("dup", in_1h)), ("dup", hdrs("dup", in_2h)),          # the first one stands
        ("late", hdrs("late", now_ms - 10)),                                 # due already: published now
        ("waiting late", hdrs("waiting late", now_ms - 10)),                # its id is waiting: a duplicate
        ("no id", [("chronosDeadline", b"123")]),
    ])]
    assert c.proc.write(messages, sort_batch(messages, now_ms * 1000, c.proc.rules))
    stored = {mid: (r.deadline_us // 1000, r.value) for mid, r in c.db.rows.items()}
    assert stored == {"waiting": (in_2h, b"waiting@0"), "back": (in_2h, b"back@5"), "dup": (in_1h, b"dup@6"),
                      "waiting late": (in_1h, b"old")}
    assert [(p.topic, p.value) for p in c.publisher.produced] == [
        (c.settings.output_topic, b"late@8"), (c.settings.dlq_topic, b"no id@10")]
    s = c.proc.stats
    assert (s["consumed"], s["enqueued"], s["replaced"], s["cancelled"], s["cancel_unknown"], s["late"], s["dead"],
            s["duplicates"]) == (11, 1, 2, 1, 1, 1, 1, 2)


def test_rows_postgres_refuses_are_dead_lettered_one_by_one():
    class RefusingStore(MemoryStore):
        def apply(self, inserts, replaces, cancels):
            if any(r.id == "poison" for r in inserts):
                raise StoreRejected("invalid byte sequence")
            return super().apply(inserts, replaces, cancels)

    now_ms = NOW // 1000
    msgs = [FakeMessage(hdrs("good", now_ms + 60_000)), FakeMessage(hdrs("poison", now_ms + 60_000))]
    batch = sort_batch(msgs, NOW, RULES)
    c = Consumer(RefusingStore())
    assert c.proc.apply_one_by_one(batch, StoreRejected("x")) == (1, 0, 0, 0)
    assert list(batch.rows) == ["good"]
    assert [(h[0][1], r.split(":")[0]) for _, r, h in batch.dead] == [(b"poison", "store_rejected")]


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_offsets_are_committed_only_once_their_batch_is_durable(caplog):
    """PostgreSQL is away when a batch arrives: the consumer retries with backoff and commits
    nothing; once the batch is stored, its offsets are committed."""
    c = Consumer()
    c.db.unavailable = "connection refused"
    in_1h = time.time_ns() // 1_000_000 + 3_600_000
    caplog.set_level("WARNING", logger="chronos.consumer")
    thread = threading.Thread(target=c.proc.run)
    thread.start()
    try:
        wait_for(lambda: c.input is not None, "the consumer to start")
        assert c.input.topics == [c.settings.input_topic]
        c.input.feed([FakeMessage(hdrs("a", in_1h), offset=7), FakeMessage(hdrs("b", in_1h), offset=8, partition=1)])
        wait_for(lambda: any("postgres unavailable" in r.getMessage() for r in caplog.records), "the outage log")
        assert c.input.commits == []
        c.db.unavailable = None
        wait_for(lambda: c.input.commits, "the commit")
        offsets, stored_then = c.input.commits[0]
        assert offsets == {("in", 0): 8, ("in", 1): 9} and stored_then == ["a", "b"]
        assert "postgres reachable again after" in caplog.records[-1].getMessage()
    finally:
        c.life.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive()


def test_a_batch_not_yet_durable_when_the_consumer_stops_is_not_committed(caplog):
    """Stopped while PostgreSQL is away: the batch is read again by whoever consumes next."""
    c = Consumer()
    c.db.unavailable = "connection refused"
    caplog.set_level("WARNING", logger="chronos.consumer")
    thread = threading.Thread(target=c.proc.run)
    thread.start()
    try:
        wait_for(lambda: c.input is not None, "the consumer to start")
        c.input.feed([FakeMessage(hdrs("a", time.time_ns() // 1_000_000 + 3_600_000), offset=3)])
        wait_for(lambda: any("postgres unavailable" in r.getMessage() for r in caplog.records), "the outage log")
    finally:
        c.life.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert c.input.commits == [] and c.db.rows == {}
