"""The consumer's loop on the in-memory store and Kafka doubles: the batch's store operations,
late and invalid messages, and offsets committed only once their batch is durable."""

from __future__ import annotations

import re
import threading
import time
import types
import uuid

import pytest
from prometheus_client.exposition import generate_latest

from chronos import codec
from chronos.adapters.kafka.clients import OutageLog
from chronos.adapters.memory import MemoryDatabase, MemoryStore
from chronos.domain.intake import Rules
from chronos.domain.model import Row
from chronos.errors import KafkaUnanswered, StoreRejected
from chronos.telemetry.metrics import ConsumerTelemetry, postgres_reached
from chronos.roles.consumer import ConsumerProcess, sort_batch
from chronos.roles.consumer.one_by_one import apply_one_by_one
from chronos.roles.consumer.writer import CLOCK_EVERY_S
from chronos.runtime.process import Lifecycle
from kafka_double import FakeMessage, FakePublisher, settings

NOW = 1_800_000_000_000_000
RULES = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile("out"))
TIMEOUT = 10.0




class FakeConsumer:
    """The input topic: `consume` hands out the batches given to `feed`, one per call, while subscribed
    (out of the group nothing is assigned: it counts the calls in `idle_calls`); `commit` records the
    offsets and what `snapshot()` says at that moment; `group` records subscribe/unsubscribe in order."""

    def __init__(self, on_commit, snapshot=lambda: None):
        self.on_commit, self.snapshot = on_commit, snapshot
        self.batches: list[list[FakeMessage]] = []
        self.commits: list[tuple[dict, object]] = []
        self.group: list[str] = []
        self.idle_calls = 0
        self.refuse_commits = False  # set: `commit` raises, as the client does when the coordinator is away
        self.lock = threading.Lock()

    def feed(self, messages):
        with self.lock:
            self.batches.append(messages)

    def subscribe(self, topics, on_lost=None):
        with self.lock:
            self.topics, self.on_lost = topics, on_lost
            self.group.append("subscribe")

    lose_next = False  # set: the next `consume` reports the session lost, as the client does (on_lost)

    def unsubscribe(self):
        with self.lock:
            self.group.append("unsubscribe")

    @property
    def subscribed(self) -> bool:
        with self.lock:
            return bool(self.group) and self.group[-1] == "subscribe"

    def consume(self, num_messages=1, timeout=-1):
        with self.lock:
            lost, self.lose_next = self.lose_next, False
        if lost:
            self.on_lost(self, [types.SimpleNamespace(topic="in", partition=0)])
        with self.lock:
            if self.group[-1] != "subscribe":
                self.idle_calls += 1
            elif self.batches:
                return self.batches.pop(0)
        time.sleep(timeout)  # as the client does when nothing is there
        return []

    # what the lag gauge reads: the assigned partitions, the position in each, the cached high watermarks
    assigned: list = []
    positions: dict = {}
    watermarks: dict = {}
    # the input topic's partitions, and what the whole group has committed of each (another consumer
    # serving its partitions moves these); None: the coordinator does not answer
    partitions = (0, 1, 2, 3)
    group_offsets: dict | None = {}

    def others_commit(self) -> None:
        """Another consumer of the group commits on every partition (it reaches PostgreSQL and Kafka)."""
        assert self.group_offsets is not None
        self.group_offsets = {p: self.group_offsets.get(p, 0) + 10 for p in self.partitions}

    progress_reads = 0

    def group_progress(self, topic, timeout):
        self.progress_reads += 1
        if self.group_offsets is None:
            return None
        return {p: self.group_offsets.get(p, -1001) for p in self.partitions}

    def ends(self):
        """As the adapter reads them: the position and the cached high watermark, -1 where unknown."""
        return {p: (self.positions.get(p, -1), self.watermarks.get(p, -1)) for p in self.assigned}

    def pause_partitions(self, partitions):
        with self.lock:
            self.paused = self.paused | set(partitions)

    def resume_partitions(self, partitions):
        with self.lock:
            self.paused = self.paused - set(partitions)
            self.resumed = self.resumed + sorted(partitions)

    def seek_partitions(self, offsets):
        with self.lock:
            self.seeks = self.seeks + [dict(offsets)]

    paused: set = set()     # (topic, partition)s paused now
    resumed: list = []      # (topic, partition)s resumed, in order
    seeks: list = []        # each seek's offsets

    def commit_offsets(self, offsets, *, wait=False):
        with self.lock:
            if self.refuse_commits:
                raise KafkaUnanswered("the coordinator is away")
            self.commits.append((dict(offsets), self.snapshot()))

    def close(self):
        pass


class Clock:
    """A `time.monotonic` for tests: it moves only when `advance` is called."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Consumer:
    """A consumer process on an in-memory database, with its parts at hand."""

    def __init__(self, store=None, clock=time.monotonic, **env):
        self.db = store.db if store is not None else MemoryDatabase()
        self.store = store or MemoryStore(self.db)
        self.publisher = FakePublisher()
        self.settings = settings(**env)
        self.life = Lifecycle()
        self.input: FakeConsumer | None = None

        def consumers(on_commit):
            self.input = FakeConsumer(on_commit, snapshot=lambda: sorted(self.db.rows))
            return self.input, OutageLog("test consumer")
        self.proc = ConsumerProcess(self.settings, self.life, store=self.store, producers=self.publisher.factory(),
                                    consumers=consumers, telemetry=ConsumerTelemetry(uuid.uuid4(), self.settings),
                                    watchers=lambda: self.input, clock=clock)


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
    assert c.proc.writer.write(messages, sort_batch(messages, now_ms * 1000, c.proc.rules))
    stored = {mid: (r.deadline_us // 1000, r.value) for mid, r in c.db.rows.items()}
    assert stored == {"waiting": (in_2h, b"waiting@0"), "back": (in_2h, b"back@5"), "dup": (in_1h, b"dup@6"),
                      "waiting late": (in_1h, b"old")}
    assert [(p.topic, p.value) for p in c.publisher.produced] == [
        (c.settings.output_topic, b"late@8"), (c.settings.dlq_topic, b"no id@10")]
    s = c.proc.stats
    assert (s["consumed"], s["enqueued"], s["replaced"], s["cancelled"], s["cancel_unknown"], s["late"], s["dead"],
            s["duplicates"]) == (11, 1, 2, 1, 1, 1, 1, 2)


def test_the_consumer_measures_its_hosts_clock_against_postgresqls_every_ten_seconds():
    """A database clock 2 s behind this host's (the host is ahead: what makes a consumer publish early): the
    offset is measured after a write and by the idle probe, at most every CLOCK_EVERY_S; a statement that
    fails leaves the last figure."""
    c = Consumer()
    c.db.now_us = lambda: time.time_ns() // 1000 - 2_000_000

    def offset() -> float:
        text = generate_latest(c.proc.metrics.registry).decode()
        return float(re.search(r"^chronos_consumer_clock_offset_seconds\{[^}]*\} (\S+)$", text, re.M)[1])
    assert offset() == 0.0
    message = [FakeMessage(hdrs("a", in_1h_ms()), offset=0)]
    assert c.proc.writer.write(message, sort_batch(message, time.time_ns() // 1000, c.proc.rules))
    assert offset() == pytest.approx(-2.0, abs=0.05)
    c.db.now_us = lambda: time.time_ns() // 1000 + 1_000_000
    c.proc.writer.measure_clock(time.monotonic())  # within CLOCK_EVERY_S of the last: not measured again
    assert offset() == pytest.approx(-2.0, abs=0.05)
    c.proc.writer.measure_clock(time.monotonic() + CLOCK_EVERY_S)
    assert offset() == pytest.approx(1.0, abs=0.05)
    c.db.unavailable = "down"
    c.proc.writer.measure_clock(time.monotonic() + 3 * CLOCK_EVERY_S)
    assert offset() == pytest.approx(1.0, abs=0.05)


def test_a_clock_reading_that_finds_postgresql_out_of_reach_is_followed_by_no_other_statement():
    """After a write, the clock's reading and the word of where the process serves /metrics run on the thread
    that writes: once the reading found PostgreSQL out of reach, the word is not tried (on a network that drops
    the packets each try holds the thread, and the next write, for its deadline)."""
    c = Consumer()
    announced: list[float] = []
    c.proc.writer.metrics.announce = lambda store, now: announced.append(now)
    c.db.unavailable = "down"
    c.proc.writer.now_and_then(time.monotonic() + 3 * CLOCK_EVERY_S)
    assert announced == []
    c.db.unavailable = None
    c.proc.writer.now_and_then(time.monotonic() + 6 * CLOCK_EVERY_S)
    assert len(announced) == 1


def test_rows_postgres_refuses_are_dead_lettered_one_by_one():
    class RefusingStore(MemoryStore):
        def apply(self, inserts, replaces, cancels, fence=None, **kw):
            if any(r.id == "poison" for r in inserts):
                raise StoreRejected("invalid byte sequence")
            return super().apply(inserts, replaces, cancels, fence, **kw)

    now_ms = NOW // 1000
    msgs = [FakeMessage(hdrs("good", now_ms + 60_000)), FakeMessage(hdrs("poison", now_ms + 60_000))]
    batch = sort_batch(msgs, NOW, RULES)
    c = Consumer(RefusingStore())
    assert apply_one_by_one(c.proc.store, batch, StoreRejected("x")) == (1, 0, 0, 0)
    assert list(batch.rows) == ["good"]
    assert [(h[0][1], r.split(":")[0]) for _, r, h in batch.dead] == [(b"poison", "store_rejected")]


def wait_for(predicate, what: str):
    """Poll until predicate() is truthy; returns what it returned."""
    deadline = time.monotonic() + TIMEOUT
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return found


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



def logged(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


class CountingStore(MemoryStore):
    """Counts the batches it is asked to apply (failed tries included)."""

    tries = 0

    def apply(self, inserts, replaces, cancels, fence=None, **kw):
        self.tries += 1
        return super().apply(inserts, replaces, cancels, fence, **kw)


class Running:
    """A consumer process (on a `CountingStore`) running on a thread, its clock driven by the test, stopped
    on leaving."""

    def __init__(self, caplog, **env):
        self.clock = Clock()
        self.store = CountingStore()
        self.c = Consumer(store=self.store, clock=self.clock, **env)
        caplog.set_level("INFO", logger="chronos.consumer")
        self.thread = threading.Thread(target=self.c.proc.run)

    def __enter__(self):
        self.thread.start()
        wait_for(lambda: self.c.input is not None and self.c.input.subscribed, "the consumer to subscribe")
        return self

    @property
    def input(self) -> FakeConsumer:
        assert self.c.input is not None
        return self.c.input

    def stop(self) -> float:
        """Stop the process; how long it took to end."""
        stopped = time.monotonic()
        self.c.life.stop()
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()
        return time.monotonic() - stopped

    def __exit__(self, *exc):
        self.stop()

    def cut_off(self, *messages: FakeMessage) -> None:
        """PostgreSQL out of reach; a batch of `messages` arrives and fails to be written."""
        self.c.db.unavailable = "connection refused"
        tries = self.store.tries
        self.input.feed(list(messages))
        wait_for(lambda: self.store.tries > tries, "a failed write")


def in_1h_ms() -> int:
    return time.time_ns() // 1_000_000 + 3_600_000


def test_postgres_out_of_reach_past_the_hold_time_gives_the_batch_up_and_leaves_the_group(caplog):
    """This host cut off from PostgreSQL only: once the hold time is over with a batch to write, the
    consumer leaves the group so that other consumers take its partitions; neither the batch nor the one
    read after it is committed, then or at close, and it stays out (serving the client, its loop beating,
    PostgreSQL reported not reached) until PostgreSQL answers."""
    with Running(caplog) as r:
        c = r.c
        r.input.feed([FakeMessage(hdrs("a", in_1h_ms()), offset=1)])
        wait_for(lambda: r.input.commits, "the first batch's commit")
        reached = postgres_reached(c.store)
        r.cut_off(FakeMessage(hdrs("b", in_1h_ms()), offset=5))
        r.input.others_commit()  # the other consumers reach PostgreSQL: they can take the partitions
        r.input.feed([FakeMessage(hdrs("c", in_1h_ms()), offset=6)])
        wait_for(lambda: not r.input.batches, "the next batch to be read")
        tries = r.store.tries
        wait_for(lambda: r.store.tries > tries, "another try")
        assert r.input.group == ["subscribe"]  # within the hold time: it retries
        r.clock.advance(c.settings.hold_time_ms / 1000.0 + 0.1)
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe"], "the consumer to leave the group")
        [left] = wait_for(lambda: logged(caplog, "left consumer group"), "the warning")  # logged after leaving
        assert re.search(r"cannot reach PostgreSQL for 5\.\ds, longer than the hold time \(5000 ms\): gave up 2 "
                         r"messages .* left consumer group chronos so that other consumers take its partitions", left)
        assert "out of consumer group chronos" in (c.proc.group.out_of_group() or "")
        calls, beat = r.input.idle_calls, c.proc.metrics.last_loop
        wait_for(lambda: r.input.idle_calls > calls + 2 and c.proc.metrics.last_loop > beat,
                 "the client served and the loop beating out of the group")
        assert postgres_reached(c.store) == reached
        assert r.input.group == ["subscribe", "unsubscribe"]
    assert [offsets for offsets, _ in r.input.commits] == [{("in", 0): 2}]  # not b, not c, and a not again
    assert sorted(c.db.rows) == ["a"]


def test_back_in_the_group_once_postgres_answers_the_next_batch_is_written_and_committed(caplog):
    with Running(caplog) as r:
        r.cut_off(FakeMessage(hdrs("b", in_1h_ms()), offset=5))
        r.input.others_commit()
        r.clock.advance(r.c.settings.hold_time_ms / 1000.0)
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe"], "the consumer to leave the group")
        r.c.db.unavailable = None
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe", "subscribe"], "the consumer to rejoin")
        wait_for(lambda: logged(caplog, "PostgreSQL answers again: rejoining consumer group chronos"), "the log line")
        assert r.c.proc.group.out_of_group() is None
        # the given-up batch is read again (by whichever consumer holds the partition), with what follows it
        r.input.feed([FakeMessage(hdrs("b", in_1h_ms()), offset=5), FakeMessage(hdrs("c", in_1h_ms()), offset=6)])
        wait_for(lambda: r.input.commits, "the commit")
        offsets, stored_then = r.input.commits[0]
        assert offsets == {("in", 0): 7} and stored_then == ["b", "c"]


def test_an_outage_shorter_than_the_hold_time_keeps_the_consumer_in_the_group(caplog):
    """Past most of the hold time the consumer still retries the batch in the group, and commits it once
    PostgreSQL answers."""
    with Running(caplog) as r:
        r.cut_off(FakeMessage(hdrs("b", in_1h_ms()), offset=5))
        r.clock.advance(r.c.settings.hold_time_ms / 1000.0 - 0.5)
        tries = r.store.tries
        wait_for(lambda: r.store.tries >= tries + 2, "two more tries past most of the hold time")
        assert r.input.group == ["subscribe"]
        r.c.db.unavailable = None
        wait_for(lambda: r.input.commits, "the commit")
        assert r.input.commits[0][0] == {("in", 0): 6}
        assert r.input.group == ["subscribe"] and not logged(caplog, "left consumer group")


def test_a_stop_while_out_of_the_group_is_prompt_and_commits_nothing(caplog):
    with Running(caplog) as r:
        r.cut_off(FakeMessage(hdrs("b", in_1h_ms()), offset=5))
        r.input.others_commit()
        r.clock.advance(r.c.settings.hold_time_ms / 1000.0)
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe"], "the consumer to leave the group")
        assert r.stop() < 0.5
    assert r.input.commits == [] and r.input.group == ["subscribe", "unsubscribe"]


def test_offsets_left_uncommitted_before_leaving_the_group_are_not_committed_after_rejoining(caplog):
    """A commit that failed before the outage is not retried once back in the group: the partition may be
    another consumer's by then, its offset moved past, and committing would move it back."""
    with Running(caplog) as r:
        r.input.refuse_commits = True
        r.input.feed([FakeMessage(hdrs("a", in_1h_ms()), offset=1)])
        wait_for(lambda: logged(caplog, "offset commit failed"), "the failed commit")
        r.input.refuse_commits = False
        r.cut_off(FakeMessage(hdrs("b", in_1h_ms()), offset=5))
        r.input.others_commit()
        r.clock.advance(r.c.settings.hold_time_ms / 1000.0)
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe"], "the consumer to leave the group")
        r.c.db.unavailable = None
        wait_for(lambda: r.input.group[-1] == "subscribe", "the consumer to rejoin")
        r.input.feed([FakeMessage(hdrs("c", in_1h_ms()), offset=9, partition=1)])
        wait_for(lambda: r.input.commits, "the commit")
    # c's offset, as the loop commits it and again at close; never partition 0's
    assert [offsets for offsets, _ in r.input.commits] == [{("in", 1): 10}] * 2


def test_late_messages_kafka_acknowledges_none_of_for_the_hold_time_give_the_batch_up_and_leave_the_group(caplog):
    """This host cut off from Kafka while a batch's late messages wait for their acknowledgements: once
    the hold time is over the consumer purges what waits to be sent (nothing of the batch is published
    by it later: the partition's next owner publishes it), leaves the group without committing, and
    rejoins once Kafka answers a metadata request."""
    with Running(caplog) as r:
        r.c.publisher.answering = False
        r.input.feed([FakeMessage(hdrs("late", time.time_ns() // 1_000_000 - 1000), offset=4)])
        wait_for(lambda: r.c.publisher.produced, "the late message's publish")
        assert r.input.group == ["subscribe"]  # within the hold time: it waits for the acknowledgement
        reads = r.input.progress_reads
        r.clock.advance(r.c.settings.hold_time_ms / 2000.0 + 0.1)
        wait_for(lambda: r.input.progress_reads > reads, "the group's progress read half a hold time in")
        r.input.others_commit()  # the other consumers reach Kafka
        r.clock.advance(r.c.settings.hold_time_ms / 2000.0)
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe"], "the consumer to leave the group")
        [left] = wait_for(lambda: logged(caplog, "left consumer group"), "the warning")  # logged after leaving
        assert re.search(r"cannot reach Kafka for 5\.\d+s, longer than the hold time \(5000 ms\): gave up 1 messages", left)
        assert r.c.publisher.pending == []  # purged: not sent once Kafka answers again
        calls = r.input.idle_calls
        wait_for(lambda: r.input.idle_calls > calls + 2, "the client served out of the group")
        assert r.input.group == ["subscribe", "unsubscribe"]
        r.c.publisher.answering = True
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe", "subscribe"], "the consumer to rejoin")
        wait_for(lambda: logged(caplog, "Kafka answers again: rejoining consumer group chronos"), "the log line")
        assert [p.value for p in r.c.publisher.produced] == [b"v"]  # published once, never again by this consumer
    assert r.input.commits == []


def test_late_messages_acknowledged_within_the_hold_time_keep_the_consumer_in_the_group(caplog):
    with Running(caplog) as r:
        r.c.publisher.answering = False
        r.input.feed([FakeMessage(hdrs("late", time.time_ns() // 1_000_000 - 1000), offset=4)])
        wait_for(lambda: r.c.publisher.produced, "the late message's publish")
        r.clock.advance(r.c.settings.hold_time_ms / 1000.0 - 0.5)
        r.c.publisher.answering = True
        wait_for(lambda: r.input.commits, "the commit")
        assert r.input.commits[0][0] == {("in", 0): 5}
        assert r.input.group == ["subscribe"] and not logged(caplog, "left consumer group")


def test_the_lag_gauge_is_what_each_assigned_partition_holds_past_the_position():
    """Partition 0 read to 5 of 12, partition 1 not fetched yet (no watermark): lags of 7 and 0 on 2
    partitions, read every LAG_EVERY_S, not at every poll; a partition no longer assigned leaves the gauge."""
    c = Consumer()
    c.proc.group.consumer.assigned = [0, 1]
    c.proc.group.consumer.positions, c.proc.group.consumer.watermarks = {0: 5, 1: 3}, {0: 12}
    c.proc.group.sample_lag(100.0)
    assert lags(c) == {"0": 7.0, "1": 0.0}
    text = generate_latest(c.proc.metrics.registry).decode()
    assert re.search(r'^chronos_consumer_partitions\{[^}]*\} 2\.0$', text, re.M), text
    c.proc.group.consumer.watermarks = {0: 20}
    c.proc.group.sample_lag(101.0)  # within LAG_EVERY_S: not read again
    assert lags(c) == {"0": 7.0, "1": 0.0}
    c.proc.group.consumer.assigned = [0]
    c.proc.group.sample_lag(106.0)
    assert lags(c) == {"0": 15.0}
    assert set(lags(c, "seconds")) == {"0"}


def lags(c: Consumer, unit: str = "messages") -> dict[str, float]:
    text = generate_latest(c.proc.metrics.registry).decode()
    return {m[0]: float(m[1]) for m in
            re.findall(rf'^chronos_consumer_lag_{unit}\{{[^}}]*partition="(\d+)"[^}}]*\}} (\S+)$', text, re.M)}


def test_the_time_behind_grows_while_the_consumers_loop_stands_still_and_is_0_once_it_has_read_everything():
    """Partition 0 caught up at 10, then 10 more messages by the next sample, 5 s later, none read: the
    oldest unread message arrived between the two samples (half-way for the first of ten: 0.5 s in); the
    scrapes after it see the time grow with no further sample (a loop waiting on a write)."""
    clock = Clock()
    c = Consumer()
    c.proc.metrics.health.clock = clock
    group = c.proc.group
    group.consumer.assigned, group.consumer.positions, group.consumer.watermarks = [0], {0: 10}, {0: 10}
    group.sample_lag(clock())
    assert lags(c, "seconds") == {"0": 0.0}
    clock.advance(5.0)
    group.consumer.watermarks = {0: 20}
    group.sample_lag(clock())
    assert lags(c, "seconds") == {"0": pytest.approx(4.5)}
    clock.advance(60.0)
    assert lags(c, "seconds") == {"0": pytest.approx(64.5)}
    group.consumer.positions = {0: 20}
    group.sample_lag(clock())
    assert lags(c, "seconds") == {"0": 0.0} and lags(c) == {"0": 0.0}


def test_while_no_other_consumer_commits_a_consumer_waits_out_the_outage_in_the_group(caplog):
    """PostgreSQL out of reach for every consumer (a failover, a primary cut off): leaving would hand the
    partitions to nobody who can serve them, and make the whole group join again afterwards. It stays,
    says so, and leaves once another consumer commits."""
    with Running(caplog) as r:
        r.cut_off(FakeMessage(hdrs("b", in_1h_ms()), offset=5))
        r.clock.advance(r.c.settings.hold_time_ms / 1000.0 + 0.1)
        wait_for(lambda: logged(caplog, "and no other consumer of group chronos has committed since: staying"),
                 "the consumer to say it stays")
        tries = r.store.tries
        wait_for(lambda: r.store.tries > tries, "another try, in the group")
        assert r.input.group == ["subscribe"]
        r.input.others_commit()
        wait_for(lambda: r.input.group == ["subscribe", "unsubscribe"], "the consumer to leave once others serve")
    assert r.input.commits == []


def test_a_coordinator_out_of_reach_says_nothing_of_the_others_and_the_consumer_stays():
    c = Consumer()
    c.proc.group.consumer.group_offsets = None
    assert c.proc.group.progress() is None
    assert not c.proc.group.others_serve({0: 5}) and not c.proc.group.others_serve(None)
    c.proc.group.consumer.group_offsets = {0: 5}
    assert not c.proc.group.others_serve({0: 5}) and c.proc.group.others_serve({0: 4})
    assert c.proc.group.progress() == {0: 5, 1: -1001, 2: -1001, 3: -1001}


def test_its_own_commit_landing_late_is_not_the_others_progress():
    c = Consumer()
    c.proc.group.commit([FakeMessage(hdrs("a", in_1h_ms()), offset=4)])
    c.proc.group.consumer.group_offsets = {0: 5}  # its own asynchronous commit, landed after the outage began
    assert not c.proc.group.others_serve({0: 3})
    c.proc.group.consumer.group_offsets = {0: 7}
    assert c.proc.group.others_serve({0: 3})


def test_the_group_is_watched_by_a_client_of_its_own_made_at_the_first_look():
    """The input consumer serves one call at a time and the loop calls it every 50 ms: the writer thread
    asking it for the group's offsets waited for good (seen: a consumer that stopped consuming)."""
    made = []
    c = Consumer()
    c.proc.group.watchers = lambda: made.append(FakeConsumer(lambda *a: None)) or made[-1]
    assert made == []
    c.proc.group.progress()
    c.proc.group.progress()
    assert len(made) == 1 and made[0] is not c.proc.group.consumer


def test_a_batch_read_before_the_groups_session_was_lost_is_never_written_nor_committed(caplog):
    """This host cut off from everything: the batch it read just before cannot be written, and the client
    reports the group's session lost (its partitions may be another consumer's, who reads and fires the
    batch). Once PostgreSQL answers again, that batch is given up, not written late behind the other's
    back, and not committed; what is read after the loss is written and committed as usual."""
    with Running(caplog) as r:
        c = r.c
        r.cut_off(FakeMessage(hdrs("b", in_1h_ms()), offset=5))
        r.input.lose_next = True
        wait_for(lambda: logged(caplog, "the group's session timed out"), "the loss reported")
        c.db.unavailable = None  # PostgreSQL answers again: the write's next try would succeed
        [gave_up] = wait_for(lambda: logged(caplog, "read before the group's session was lost"), "the batch given up")
        assert "gave up a batch of 1 messages" in gave_up
        assert "b" not in c.db.rows
        r.input.feed([FakeMessage(hdrs("b", in_1h_ms()), offset=5), FakeMessage(hdrs("c", in_1h_ms()), offset=6)])
        wait_for(lambda: r.input.commits, "the batch read after the loss committed")
    # only the batch read after the loss (again at close, as its last), never the one given up
    assert {tuple(offsets.items()) for offsets, _ in r.input.commits} == {((("in", 0), 7),)}
    assert sorted(c.db.rows) == ["b", "c"]
