"""The fault-test harness: a real `chronos up`, a steady load, a reader, and the accounting.

Used by the fault scenarios (tests/faults, tests/ha), the soak run (benchmarks/soak.py) and the
PostgreSQL failures under load (benchmarks/ha.py), on the stack of harness.stack (`chronos up` as a
subprocess, its supervisord through chronos.up.supervisor):

- `Load` produces a steady rate of messages from a thread (mixed delays, some already late);
  only messages the broker acknowledged count as sent.
- `Reader` reads the output topic from a thread and stamps every arrival with the local clock.
- `analyse` turns both into the verdict: lost, early, duplicates (and whether each one is
  explained by a fault), lateness, and the recovery time of every fault; `resumed`, when firing
  resumed after a fault and the jitter after it.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.harness.report import percentiles
from benchmarks.harness.stack import ChronosUp
from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS as EMBEDDED_KAFKA
TIMING_ADVANCE_S = 0.050   # chronos's default CHRONOS_TIMING_ADVANCE_MS
LATE_S = 1.0               # a delivery later than this after its due time counts as delayed by a fault


# -- the store -------------------------------------------------------------------------------


def held_rows(database_url: str, node: str | None = None) -> dict[str, float]:
    """Rows claimed (readied) right now, by `node` or by anyone: id -> readied_at (epoch s)."""
    sql = "SELECT id, extract(epoch FROM readied_at)::float8 FROM chronos_messages WHERE readied_at IS NOT NULL"
    params: tuple = ()
    if node is not None:
        sql += " AND readied_by = %s"
        params = (node,)
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        return dict(conn.execute(sql, params).fetchall())


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


class Reader(threading.Thread):
    """Reads the output topic from the beginning; arrivals[id] = local read times.

    A record read twice (the reader's own group rebalanced and read again from the last
    position it knew, e.g. after the broker was paused) counts once: deliveries are told apart
    by their (partition, offset).
    """

    def __init__(self, bootstrap: str, topic: str, fetch_wait_ms: int = 10):
        super().__init__(daemon=True, name="reader")
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

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def session_losses(log_dir: Path, window: float = 10.0) -> list[Fault]:
    """Consumers whose group session expired on their own (the broker did not answer for longer than
    the session timeout): their last batch is read again, so what was sent shortly before may be
    published twice. Found in the consumers' logs as failed offset commits."""
    faults = []
    for path in sorted(log_dir.glob("consumer_*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "offset commit failed" in line:
                at = time.mktime(time.strptime(line[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone + float(line[19:23])
                faults.append(Fault(f"{path.stem}: {line[24:].strip()[:80]}", at - window, at, observed=True))
    return faults


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


# -- faults and the verdict -------------------------------------------------------------------


@dataclass
class Fault:
    """One injected fault: what, when it began and ended, and what was in flight when it began."""

    what: str
    start: float
    end: float | None = None
    back_running: float | None = None         # when supervisord had the program RUNNING again
    held: dict[str, float] = field(default_factory=dict)   # rows a killed firer held: id -> readied_at
    committed: dict[int, int] | None = None   # the consumer group's committed offsets at the fault
    node: str | None = None                   # node id of the killed process
    observed: bool = False                    # not injected: seen in the logs (explains what was sent in it)

    def ended(self) -> float:
        return self.end if self.end is not None else self.start


@dataclass
class Report:
    scenario: str
    sent: int
    delivered: int
    lost: list[str]
    early: list[tuple[str, float]]
    duplicates: int
    duplicated_ids: dict[str, int]
    unexplained: list[str]
    recovery_s: float
    max_lateness_s: float
    p99_lateness_s: float
    faults: list[Fault]
    lost_found_on_reread: list[str] = field(default_factory=list)  # the live reader missed them; on the topic after all
    session_losses: int = 0  # consumer group sessions that expired without an injected fault

    def row(self) -> dict:
        return {"scenario": self.scenario, "sent": self.sent, "delivered": self.delivered,
                "lost": len(self.lost), "early": len(self.early), "duplicates": self.duplicates,
                "unexplained_duplicates": len(self.unexplained), "recovery_s": round(self.recovery_s, 2),
                "max_lateness_s": round(self.max_lateness_s, 2), "p99_lateness_s": round(self.p99_lateness_s, 3),
                "faults": len(self.faults), "lost_found_on_reread": len(self.lost_found_on_reread),
                "session_losses": self.session_losses}

    def line(self) -> str:
        r = self.row()
        return (f"{r['scenario']:<28} sent={r['sent']:<6} delivered={r['delivered']:<6} lost={r['lost']:<3} "
                f"early={r['early']:<3} duplicates={r['duplicates']:<5} (unexplained {r['unexplained_duplicates']}) "
                f"recovery={r['recovery_s']:.1f}s max_lateness={r['max_lateness_s']:.1f}s faults={r['faults']} "
                f"session_losses={r['session_losses']}")


def analyse(scenario: str, load: Load, reader: Reader, faults: list[Fault], *, hold_s: float,
            window_explains: bool = False) -> Report:
    """The verdict of one run.

    A duplicate is explained when the message was in flight at a fault: held (claimed) by a
    firer that was killed, or at or past the consumer group's committed offset when a consumer
    died or left (and sent before the group settled again); for outages of a whole service
    (`window_explains`), when it was due between `hold_s` before the outage and its end; for a
    consumer group session that expired on its own (an `observed` fault, from the logs), when it
    was sent in the seconds before.
    Recovery of a fault: from its end until the last message it delayed was delivered and the
    program was RUNNING again.
    """
    sent = load.sent
    arrivals = reader.arrivals
    lost = sorted(m for m in sent if m not in arrivals)
    early = [(m, s.deadline - min(arrivals[m])) for m, s in sent.items()
             if m in arrivals and min(arrivals[m]) < s.deadline - TIMING_ADVANCE_S]
    dup_ids = {m: len(arrivals[m]) - 1 for m in sent if len(arrivals.get(m, ())) > 1}

    def explained(m: str) -> bool:
        s = sent[m]
        for f in faults:
            if f.observed:
                if f.start <= s.produced <= f.ended():
                    return True
                continue
            if m in f.held:
                return True
            if f.committed is not None and s.produced <= f.ended() + 10 and \
                    s.offset >= f.committed.get(s.partition, -1):
                return True
            if window_explains and f.start - hold_s - 1 <= s.due <= f.ended() + 1:
                return True
        return False

    unexplained = sorted(m for m in dup_ids if not explained(m))
    lateness = {m: min(arrivals[m]) - s.due for m, s in sent.items() if m in arrivals}
    # a fault is over when the messages due while it lasted (from a hold time before it began: rows
    # already claimed) that it delayed have arrived, and its program is RUNNING again; messages due
    # later are left out, so a later hiccup of the (shared) machine does not count
    injected = [f for f in faults if not f.observed]
    done = {id(f): max(f.ended(), f.back_running or 0.0) for f in injected}
    for m, s in sent.items():
        if m in arrivals and lateness[m] > LATE_S:
            candidates = [f for f in injected if f.start - hold_s - 1 <= s.due <= f.ended() + 1]
            if candidates:
                f = max(candidates, key=lambda f: f.start)
                done[id(f)] = max(done[id(f)], min(arrivals[m]))
    recovery = max((done[id(f)] - f.ended() for f in injected), default=0.0)
    figures = percentiles(list(lateness.values())) or {"max": 0.0, "p99": 0.0}
    return Report(scenario, len(sent), len(set(arrivals) & set(sent)), lost, early, sum(dup_ids.values()),
                  dup_ids, unexplained, recovery, figures["max"], figures["p99"], injected)


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


class Scenario:
    """A stack under steady load for one fault scenario; `finish` drains it and returns the verdict."""

    def __init__(self, name: str, workdir: Path, *up_args: str, rate: float = 500, hold_s: float = 3.0,
                 partitions: int = 4, seed: int | None = None, linger_ms: int = 5, fetch_wait_ms: int = 10):
        self.name, self.rate, self.hold_s, self.partitions, self.seed = name, rate, hold_s, partitions, seed
        self.linger_ms, self.fetch_wait_ms = linger_ms, fetch_wait_ms
        self.stack = ChronosUp("--hold-time-ms", str(int(hold_s * 1000)), "--partitions", str(partitions), *up_args,
                           workdir=workdir)
        self.faults: list[Fault] = []
        self.load: Load | None = None
        self.reader: Reader | None = None
        self.offsets: OffsetWatcher | None = None

    def __enter__(self) -> "Scenario":
        try:
            info = self.stack.start()
            self.reader = Reader(info["bootstrap_servers"], info["output_topic"], self.fetch_wait_ms)
            self.reader.start()
            self.reader.wait_assigned()
            self.offsets = OffsetWatcher(info["bootstrap_servers"], "chronos", info["input_topic"], self.partitions)
            self.load = Load(info["bootstrap_servers"], info["input_topic"], rate=self.rate, seed=self.seed,
                             linger_ms=self.linger_ms)
            self.load.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def info(self) -> dict:
        return self.stack.info

    def fault(self, what: str, start: float, **kw) -> Fault:
        f = Fault(what, start, **kw)
        self.faults.append(f)
        return f

    def kill_consumer(self, name: str) -> Fault:
        """SIGKILL a running consumer; record the committed offsets at that moment and its restart."""
        pid, at = self.stack.kill_program(name)
        f = self.fault(f"SIGKILL {name}", at, committed=self.offsets.committed())
        _, f.back_running = self.stack.wait_running(name, not_pid=pid)
        return f

    def kill_firer(self, name: str, wait_held: float = 5.0) -> Fault:
        """SIGKILL a running firer while it holds claimed rows; record those rows and its restart."""
        pid = self.stack.running(name) or self.stack.wait_running(name)[0]
        node = self.stack.node_of(name, pid)
        url = self.info["database_url"]
        end = time.monotonic() + wait_held
        while not held_rows(url, node) and time.monotonic() < end:
            time.sleep(0.02)
        pid, at = self.stack.kill_program(name)
        # its PostgreSQL backend may still finish a statement sent just before the kill
        time.sleep(0.5)
        f = self.fault(f"SIGKILL {name}", at, held=held_rows(url, node), node=node)
        _, f.back_running = self.stack.wait_running(name, not_pid=pid)
        return f

    def lag(self) -> int:
        """Messages on the input topic past the consumer group's committed offsets (from what the load
        had acknowledged: the embedded broker's own end offsets are not reliable)."""
        ends: dict[int, int] = {}
        for s in list(self.load.sent.values()):
            ends[s.partition] = max(ends.get(s.partition, 0), s.offset + 1)
        committed = self.offsets.committed()
        return sum(max(0, end - max(committed.get(p, 0), 0)) for p, end in ends.items())

    def finish(self, *, window_explains: bool = False, settle: float = 3.0, drain: float = 30.0) -> Report:
        """Stop the load, wait for every message (at most `drain` s past the last due time), and judge."""
        assert self.load is not None and self.reader is not None
        self.load.stop()
        wait = max(0.0, self.load.last_due - time.time()) + self.hold_s + drain
        self.reader.wait_for(self.load.sent, timeout=wait)
        time.sleep(settle)  # late duplicates
        self.reader.stop()
        self.dump(self.stack.workdir / "raw.json")
        observed = session_losses(self.stack.log_dir)
        report = analyse(self.name, self.load, self.reader, self.faults + observed, hold_s=self.hold_s,
                         window_explains=window_explains)
        report.session_losses = len(observed)
        if report.lost:
            # The reader at the head of the output topic has been seen to skip a few messages that
            # are on the topic (the embedded broker's fetches; docs/operations/embedded-stack.md): what counts is the topic.
            found = reread(self.info["bootstrap_servers"], self.info["output_topic"], set(report.lost))
            report.lost_found_on_reread = sorted(found)
            report.lost = [m for m in report.lost if m not in found]
            report.delivered += len(found)
        return report

    def dump(self, path: Path) -> None:
        """Everything sent and read, and the faults, for a look after the run."""
        path.write_bytes(orjson.dumps({
            "sent": {m: [s.deadline, s.produced, s.partition, s.offset] for m, s in self.load.sent.items()},
            "arrivals": self.reader.arrivals,
            "faults": [{"what": f.what, "start": f.start, "end": f.end, "back_running": f.back_running,
                        "held": len(f.held), "node": f.node} for f in self.faults]}))

    def __exit__(self, *exc) -> None:
        if self.load is not None and self.load.is_alive():
            self.load._halt.set()
            self.load.join(10)
        if self.reader is not None and self.reader.is_alive():
            self.reader.stop()
        if self.offsets is not None:
            self.offsets.close()
            self.offsets = None
        self.stack.stop()


# -- when firing resumed ---------------------------------------------------------------------


def longest_pause(sc: Scenario, fault_at: float, within: float = 150.0, *,
                  to_end: bool = False) -> tuple[float, float] | None:
    """(start, end) of the longest pause between two deliveries in the `within` seconds after a fault at
    `fault_at` began (from the fault itself to the first delivery, if none came sooner); with `to_end`, a
    stall from the last delivery to the window's end counts too (a window that ends with the fault's
    last step, not one longer than the scenario)."""
    sent, arrivals = sc.load.sent, sc.reader.arrivals
    end = fault_at + within
    times = sorted(t for m in sent if m in arrivals for t in arrivals[m] if fault_at <= t <= end)
    if to_end:
        times.append(end)
    if not times:
        return None
    return max(zip([fault_at, *times[:-1]], times), key=lambda pair: pair[1] - pair[0])


def resumed(sc: Scenario, fault_at: float, within: float = 150.0) -> tuple[float | None, dict[str, float]]:
    """When firing resumed after a fault at `fault_at`: the end of the longest pause between deliveries
    after it began (a fault that stops nothing leaves only the load's own short gaps, see
    `longest_pause`); and the jitter of the messages due from five seconds after that, sent ahead of their
    deadline."""
    pause = longest_pause(sc, fault_at, within)
    if pause is None:
        return None, {}
    resume = pause[1]
    sent, arrivals = sc.load.sent, sc.reader.arrivals
    late = [min(arrivals[m]) - s.due for m, s in sent.items()
            if m in arrivals and s.due >= resume + 5.0 and s.deadline > s.produced]
    return resume, percentiles(late) or {}
