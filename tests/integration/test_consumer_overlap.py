"""The consumer reads the next batch while the previous one is written, yet commits offsets only
once their batch is durable, and in order. The write is made slow by a real lock that another
PostgreSQL session holds on the table."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg

from chronos import config
from chronos import processes
from chronos.runtime.process import Lifecycle
from helpers import chronos_headers, producer

TIMEOUT = 30.0


class ConsumeSpy:
    """The process's real Kafka consumer, noting which message values each poll returned."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.seen: set[bytes] = set()
        self.changed = threading.Condition()

    def consume(self, *args, **kwargs):
        messages = self.consumer.consume(*args, **kwargs)
        with self.changed:
            self.seen.update(m.value() for m in messages if m.error() is None)
            self.changed.notify_all()
        return messages

    def wait_for(self, value: bytes) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: value in self.seen, TIMEOUT), f"{value!r} never consumed"

    def __getattr__(self, name):
        return getattr(self.consumer, name)


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_next_batch_is_read_while_one_is_written_and_offsets_wait_for_it(chronos_env):
    settings = config.load(environ=chronos_env, default_ready_file=False)
    url = settings.database_url
    life = Lifecycle()
    proc = processes.build_consumer(settings, uuid.uuid4(), life)
    spy = proc.group.consumer = ConsumeSpy(proc.group.consumer)
    commits: list[tuple[dict[int, int], set[str]]] = []  # (offsets committed, ids stored at that moment)
    real_commit = proc.group.commit
    watcher = psycopg.connect(url, autocommit=True)

    def commit(messages, *, wait=False):
        stored = {r[0] for r in watcher.execute("SELECT id FROM chronos_messages")}
        commits.append(({m.partition(): m.offset() + 1 for m in messages}, stored))
        real_commit(messages, wait=wait)
    proc.group.commit = commit

    blocker = psycopg.connect(url)
    blocker.execute("LOCK TABLE chronos_messages IN SHARE MODE")  # inserts wait until it rolls back
    thread = threading.Thread(target=proc.run, daemon=True)
    thread.start()
    try:
        p = producer(chronos_env["CHRONOS_KAFKA_BOOTSTRAP_SERVERS"])
        due = time.time() + 3600
        # one key: one partition, so "a" is at offset 0 and "b" at offset 1 and no batch holds both
        p.produce(settings.input_topic, b"a", b"k", headers=chronos_headers("a", due))
        p.flush(10)
        wait_until(lambda: watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0] > 0, "the consumer's insert of batch a to wait on the lock")
        p.produce(settings.input_topic, b"b", b"k", headers=chronos_headers("b", due))
        p.flush(10)
        spy.wait_for(b"b")  # read while "a" is still being written
        assert commits == []  # and neither batch's offsets are committed yet

        blocker.rollback()
        wait_until(lambda: commits and max(commits[-1][0].values()) == 2, "both offsets to be committed")
        partition = next(iter(commits[0][0]))
        assert [c[0] for c in commits] == [{partition: 1}, {partition: 2}]  # in order, one batch each
        assert "a" in commits[0][1]  # committed only once "a" was stored
        assert {"a", "b"} <= commits[1][1]
    finally:
        life.stop()
        blocker.close()
        thread.join(TIMEOUT)
        watcher.close()
    assert not thread.is_alive()
