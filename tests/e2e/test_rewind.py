"""`chronos rewind`: after a restore, the consumer group moves back to a moment given with its zone, with
the processes' Kafka settings (CHRONOS_KAFKA_PROPERTIES_FILE), and only when it holds every partition."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS
from chronos.adapters.postgres.store import Store
from chronos.errors import EXIT_CONFIG, EXIT_FAILURE

from helpers import producer

PARTITIONS = 4


def _env(broker, topics, group: str, properties: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")},
            "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "CHRONOS_INPUT_TOPIC": topics["input"],
            "CHRONOS_CONSUMER_GROUP": group, "CHRONOS_KAFKA_PROPERTIES_FILE": str(properties)}


def _properties(tmp_path: Path, **extra: str) -> Path:
    path = tmp_path / "kafka.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in {**EMBEDDED_GROUP_TIMEOUTS, **extra}.items()))
    return path


def _rewind(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chronos", "rewind", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def _member(broker, topic: str, group: str) -> Consumer:
    conf = {"bootstrap.servers": broker.bootstrap_servers, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", **EMBEDDED_GROUP_TIMEOUTS}
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    return consumer


def _read(broker, topic: str, group: str, count: int) -> list[bytes]:
    """What a member of `group` reads from the group's committed offsets: `count` messages, committed."""
    consumer = _member(broker, topic, group)
    got: list = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return sorted(m.value() for m in got)


def _committed(broker, topic: str, group: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                                       timeout=10)]
    finally:
        consumer.close()


def _two_batches(broker, topic: str) -> datetime:
    """Two messages per partition, then two more half a second later; returns a moment between them.
    (Kafka finds offsets by each message's timestamp, the embedded broker by when it appended it: the
    gap is real time, so that both put the moment between the batches.)"""
    p = producer(broker.bootstrap_servers)

    def batch(tag: str) -> None:
        for i in range(2 * PARTITIONS):
            p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % PARTITIONS)
        p.flush(10)
    batch("before")
    time.sleep(0.25)
    moment = datetime.now(timezone.utc)
    time.sleep(0.25)
    batch("after")
    return moment


def test_the_group_moves_back_to_the_moment_and_reads_again_what_came_after(broker, topics, tmp_path):
    group = f"chronos-{uuid.uuid4().hex[:8]}"
    moment = _two_batches(broker, topics["input"])
    everything = _read(broker, topics["input"], group, 4 * PARTITIONS)  # the consumers had read it all
    assert len(everything) == 4 * PARTITIONS and _committed(broker, topics["input"], group) == [4] * PARTITIONS
    env = _env(broker, topics, group, _properties(tmp_path, **{"client.id": "chronos-rewind-test"}))
    # the moment in another zone than UTC: the same instant
    when = moment.astimezone(timezone(timedelta(hours=1))).isoformat()

    dry = _rewind(env, "--to", when, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would move" in dry.stdout and dry.stdout.count("4 -> 2") == PARTITIONS, dry.stdout
    assert _committed(broker, topics["input"], group) == [4] * PARTITIONS

    done = _rewind(env, "--to", when)
    assert done.returncode == 0, done.stderr
    assert dry.stdout.replace("would move", "moved") == done.stdout
    assert _committed(broker, topics["input"], group) == [2] * PARTITIONS
    assert _read(broker, topics["input"], group, 2 * PARTITIONS) == sorted(
        f"after-{i}".encode() for i in range(2 * PARTITIONS))


def test_a_time_without_a_zone_and_bad_kafka_settings_are_refused_in_one_line(broker, topics, tmp_path):
    group = f"chronos-{uuid.uuid4().hex[:8]}"
    no_zone = _rewind(_env(broker, topics, group, _properties(tmp_path)), "--to", "2026-11-26T06:14:13.000")
    assert no_zone.returncode == EXIT_CONFIG and "has no zone" in no_zone.stderr
    assert len(no_zone.stderr.strip().splitlines()) == 1
    # the properties file is read: a property librdkafka does not know is refused, by name
    bad = _rewind(_env(broker, topics, group, _properties(tmp_path, **{"no.such.property": "1"})),
                  "--to", "2026-11-26T06:14:13Z")
    assert bad.returncode == EXIT_CONFIG and "no.such.property" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_nothing_is_committed_while_another_member_holds_partitions(broker, topics, tmp_path):
    group = f"chronos-{uuid.uuid4().hex[:8]}"
    moment = _two_batches(broker, topics["input"])
    _read(broker, topics["input"], group, 4 * PARTITIONS)
    running = threading.Event()
    running.set()
    held: list[int] = []

    def consumer_still_running() -> None:  # a Chronos consumer someone forgot to stop
        member = _member(broker, topics["input"], group)
        try:
            while running.is_set():
                member.poll(0.1)
                held[:] = [tp.partition for tp in member.assignment()]
        finally:
            member.close()
    thread = threading.Thread(target=consumer_still_running, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            time.sleep(0.1)
        assert held, "the other member got no partition"
        busy = _rewind(_env(broker, topics, group, _properties(tmp_path)), "--to", moment.isoformat(), "--wait", "6")
    finally:
        running.clear()
        thread.join(30)
    assert busy.returncode == EXIT_FAILURE, busy.stdout + busy.stderr
    assert "other members hold the rest" in busy.stderr and "nothing was committed" in busy.stderr
    assert _committed(broker, topics["input"], group) == [4] * PARTITIONS


def test_with_cells_each_partition_is_named_with_its_cell_and_a_restored_cells_partitions_move_alone(
        broker, topics, tmp_path, two_cells):
    for cell, share in (("a", [0, 1]), ("b", [2, 3])):
        store = Store(two_cells[cell])
        store.open_partitions(share, 1)
        store.close()
    group = f"chronos-{uuid.uuid4().hex[:8]}"
    moment = _two_batches(broker, topics["input"])
    _read(broker, topics["input"], group, 4 * PARTITIONS)
    env = {**_env(broker, topics, group, _properties(tmp_path)),
           "CHRONOS_CELLS": " ".join(f"{cell}={url}" for cell, url in two_cells.items())}
    dry = _rewind(env, "--to", moment.isoformat(), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.strip() for line in dry.stdout.splitlines()[1:]] == [
        "partition 0 (cell a): 4 -> 2", "partition 1 (cell a): 4 -> 2", "partition 2 (cell b): 4 -> 2",
        "partition 3 (cell b): 4 -> 2"]
    done = _rewind(env, "--to", moment.isoformat(), "--cell", "b")
    assert done.returncode == 0, done.stderr
    assert "on the partitions of cell b:" in done.stdout.splitlines()[0]
    assert [line.strip() for line in done.stdout.splitlines()[1:]] == [
        "partition 2 (cell b): 4 -> 2", "partition 3 (cell b): 4 -> 2"]
    assert _committed(broker, topics["input"], group) == [4, 4, 2, 2]
    unknown = _rewind(env, "--to", moment.isoformat(), "--cell", "c")
    assert unknown.returncode == EXIT_CONFIG and "CHRONOS_CELLS lists a, b" in unknown.stderr
