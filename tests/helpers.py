"""Helpers for tests: produce messages with Chronos headers, collect what comes out, wait for a
condition, read the claim's plan."""

from __future__ import annotations

import contextlib
import queue
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer

from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS
from chronos.embedded.procs import proc_stat

EMBEDDED_KAFKA = {**EMBEDDED_GROUP_TIMEOUTS, "fetch.wait.max.ms": "10"}  # the tests' embedded profile
# The Spark driver's JVM for the tests' small, short jobs: the C1 compiler only and the serial collector, whose
# C2 compiles and parallel collector's threads would compete for two cores rather than pay back (a report's
# session and first jobs in about half the time)
SPARK_TEST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def iso(epoch_s: float) -> str:
    """ISO-8601 with milliseconds, truncated (never later than epoch_s, and never a second off)."""
    ms = int(epoch_s * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def chronos_headers(message_id: str, deadline_s: float, extra: list | None = None) -> list:
    return [("chronosMessageId", message_id.encode()), ("chronosDeadline", iso(deadline_s).encode())] + \
        list(extra or [])


def start_consumer_and_doomed_firer(processes, **env: str) -> tuple:
    """A consumer and a firer that claims far ahead (lookahead 1.4 s, polling every 50 ms), so that
    when the test kills it, it holds rows it has not published yet."""
    consumer = processes.start("consumer")
    doomed = processes.start("firer", CHRONOS_LOOKAHEAD_MS="1400", CHRONOS_POLL_INTERVAL_MS="50", **env)
    processes.wait_for_log(consumer, "starting: node")
    processes.wait_for_log(doomed, "firing from the store")
    return consumer, doomed


def producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})


def send(p: Producer, topic: str, key, value, headers) -> None:
    p.produce(topic, value, key, headers=headers)
    p.poll(0)


@dataclass
class Received:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list
    at: float  # local time it was read
    created: float = 0.0  # its CreateTime (epoch s): when its producer made it

    @property
    def header_dict(self) -> dict:
        return dict(self.headers)


class Collector:
    """Reads topics from the beginning with a fresh group; `until` polls until a predicate holds."""

    def __init__(self, bootstrap: str, topics: list[str]):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex[:8]}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                                  **EMBEDDED_KAFKA})
        self.consumer.subscribe(topics)
        self.messages: list[Received] = []

    def poll_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._poll_once()

    def _poll_once(self) -> None:
        for msg in self.consumer.consume(num_messages=1000, timeout=0.05):
            if msg.error():
                continue
            self.messages.append(Received(msg.topic(), msg.key(), msg.value(), msg.headers() or [],
                                          time.time(), msg.timestamp()[1] / 1000.0))

    def until(self, predicate, timeout: float = 30.0) -> list[Received]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self._poll_once()
            if predicate(self.messages):
                return self.messages
        raise AssertionError(f"condition not met within {timeout}s; got {len(self.messages)} messages")

    def on(self, topic: str) -> list[Received]:
        return [m for m in self.messages if m.topic == topic]

    def close(self) -> None:
        self.consumer.close()


def exited(pid: int) -> bool:
    """True once `pid` no longer runs: gone (reaped, even between opening and reading its /proc files), or a
    zombie its parent has yet to reap."""
    stat = proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def wait_exited(pid: int, timeout: float = 5.0) -> bool:
    """Whether `pid` has exited (`exited`) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def wait_for(condition, timeout: float = 30.0, what: str = "condition", every: float = 0.1):
    """Poll until condition() returns something truthy; returns it."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} not met within {timeout}s (last: {last!r})")


def settings(env: dict | None = None, argv: list[str] | None = None):
    """Chronos's settings from these environment variables and flags only (nothing of this process's)."""
    import argparse

    from chronos import config
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.load(parser.parse_args(argv or []), environ=env or {})


def claim_plan(conn) -> str:
    """PostgreSQL's plan (EXPLAIN) of the claim statement, for 100 rows due now, on connection `conn`."""
    from chronos.adapters.postgres.queries import QUERIES
    sql = QUERIES["claim"].replace("%(lookahead_ms)s", "0").replace("%(limit)s", "100") \
        .replace("%(node)s", f"'{uuid.uuid4()}'")
    return "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql))


@contextlib.contextmanager
def two_claimers(url: str):
    """One firer's two claimers (CHRONOS_FIRER_CLAIMERS=2) on stores of their own, as the firer runs them
    but called by the test: (the first, which renews the lease; the second; the outbox both hand their
    rows to). Their stores are closed at the end."""
    from chronos.adapters.postgres.store import Store
    from chronos.config import Settings
    from chronos.roles.firer.claimer import Claimer
    from chronos.roles.firer.decisions import PublishTiming
    from chronos.roles.firer.handoff import Shared
    from chronos.runtime.process import Lifecycle
    from chronos.telemetry.metrics import FirerTelemetry
    node = uuid.uuid4()
    settings = Settings(database_url=url, firer_claimers=2)
    shared, outbox = Shared(PublishTiming(settings.timing_advance_ms)), queue.SimpleQueue()
    telemetry = FirerTelemetry(node, settings)
    stores = [Store(url, node_id=node, hot_path=True, synchronous_commit=False) for _ in range(2)]
    try:
        first = Claimer(stores[0], settings, shared, telemetry, Lifecycle(), outbox=outbox, parts=2)
        second = Claimer(stores[1], settings, shared, telemetry, Lifecycle(), outbox=outbox, part=1, parts=2,
                         lead=first)
        yield first, second, outbox
    finally:
        for store in stores:
            store.close()
