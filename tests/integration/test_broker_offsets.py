"""The offset reader `chronos up` samples its embedded broker with: exact end offsets where the broker's
ListOffsets(latest) answers the last batch's base offset + 1, and a group's unread messages."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from chronos.adapters.kafka.admin import OffsetReader, create_topics
from chronos.adapters.kafka.offset_process import OffsetReaderProcess
from helpers import EMBEDDED_KAFKA


def test_exact_end_offsets_and_unread_messages_of_a_group(broker):
    topic, other = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap_servers, {topic: 2, other: 1})
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50})
    for _batch in range(3):  # three batches of 10 on partition 0, of 4 on partition 1
        for _ in range(10):
            p.produce(topic, b"x", partition=0)
        for _ in range(4):
            p.produce(topic, b"y", partition=1)
        assert p.flush(10) == 0
    p.produce(other, b"z", partition=0)
    assert p.flush(10) == 0
    # the group read 12 messages of partition 0 and none of partition 1
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group, **EMBEDDED_KAFKA})
    c.commit(offsets=[TopicPartition(topic, 0, 12)], asynchronous=False)
    listed = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]
    c.close()

    reader = OffsetReader(broker.bootstrap_servers, group, topic)
    try:
        offsets = reader.read()
    finally:
        reader.close()
    assert offsets.exact
    assert offsets.ends[(topic, 0)] == (0, 30) and offsets.ends[(topic, 1)] == (0, 12)
    assert offsets.ends[(other, 0)] == (0, 1)
    assert listed <= 30  # what a plain ListOffsets says (21, the last batch's base + 1, on the embedded broker)
    assert offsets.committed == {(topic, 0): 12}
    assert offsets.unread(topic) == 30 - 12 + 12
    assert offsets.messages >= 30 + 12 + 1  # other tests' topics on the same broker count too


def test_an_unreachable_broker_is_unavailable_not_a_crash():
    from chronos.embedded.procs import free_port
    from chronos.errors import UnavailableError
    reader = OffsetReader(f"127.0.0.1:{free_port()}", "g", "t", timeout=0.5)
    try:
        with pytest.raises(UnavailableError):
            reader.read()
    finally:
        reader.close()


def test_the_reader_in_a_process_of_its_own_reads_the_same(broker):
    """chronos up's broker watch reads through a child process: the same offsets as in process."""
    topic, group = f"in-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap_servers, {topic: 2})
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50})
    for _ in range(7):
        p.produce(topic, b"x", partition=1)
    assert p.flush(10) == 0
    reader = OffsetReaderProcess(broker.bootstrap_servers, group, topic, {"linger.ms": "100"})
    try:
        offsets = reader.read()
        assert reader.pid is not None and reader.pid != os.getpid()
    finally:
        reader.close()
    assert offsets.exact and offsets.ends[(topic, 1)] == (0, 7) and offsets.unread(topic) == 7


def test_a_reader_process_that_dies_is_unavailable_and_replaced(broker, caplog):
    from chronos.errors import UnavailableError
    reader = OffsetReaderProcess(broker.bootstrap_servers, "g", "t")
    try:
        reader.read()
        first = reader.pid
        assert first is not None
        os.kill(first, signal.SIGSEGV)  # what librdkafka did to chronos up itself
        with caplog.at_level(logging.WARNING, logger="chronos.kafka"):
            with pytest.raises(UnavailableError, match="SIGSEGV"):
                reader.read()
        assert "another starts at the next sample" in caplog.text
        assert reader.read().exact is not None
        assert reader.pid not in (None, first)
    finally:
        reader.close()


def test_a_reader_process_that_hangs_is_replaced(broker, caplog, monkeypatch):
    from chronos.adapters.kafka import offset_process
    from chronos.errors import UnavailableError
    reader = OffsetReaderProcess(broker.bootstrap_servers, "g", "t", timeout=0.2)
    try:
        reader.read()
        first = reader.pid
        assert first is not None
        os.kill(first, signal.SIGSTOP)
        # a stopped child never answers: no need to wait the margin a busy one is given
        margin = offset_process.ANSWER_MARGIN_S
        monkeypatch.setattr(offset_process, "ANSWER_MARGIN_S", 0.5)
        with caplog.at_level(logging.WARNING, logger="chronos.kafka"):
            with pytest.raises(UnavailableError, match="answered nothing in time"):
                reader.read()
        monkeypatch.setattr(offset_process, "ANSWER_MARGIN_S", margin)
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # killed and reaped, not left behind
        reader.read()
        assert reader.pid not in (None, first)
    finally:
        reader.close()


# Deletes topics while chronos up's reader (broker_offset_reader) samples them, in a process of its own:
# with the reader in process, librdkafka crashed that process (SIGSEGV) within a few cycles.
CHURN = """
import sys, time
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from chronos import config
from chronos.adapters.kafka.admin import create_topics
from chronos.up.stack import broker_offset_reader

bootstrap = sys.argv[1]
settings = config.load(None, {"CHRONOS_KAFKA_BOOTSTRAP_SERVERS": bootstrap}, default_ready_file=False)
reader = broker_offset_reader(bootstrap, settings)
admin, producer = AdminClient({"bootstrap.servers": bootstrap}), Producer({"bootstrap.servers": bootstrap})
read = 0
for i in range(8):
    name = f"churn-{sys.argv[2]}-{i}"
    create_topics(bootstrap, {name: 2})
    for _ in range(50):
        producer.produce(name, b"x")
    producer.flush(10)
    ends = reader.read().ends
    read += any(ends.get((name, p), (0, 0))[1] > 0 for p in (0, 1))
    for future in admin.delete_topics([name], operation_timeout=10).values():
        future.result()
    for _ in range(3):
        try:
            reader.read()
        except Exception as exc:
            print("unavailable:", exc)
reader.close()
print("read", read)
"""


def test_topics_deleted_while_sampled_never_take_the_sampler_down(tmp_path):
    # a broker of its own, as chronos up's: each sample reads every topic's offsets, and the session's broker
    # holds the topics of every test before (49 s in CI against 8 s on a broker holding only these)
    from chronos.embedded.broker import EmbeddedBroker
    broker = EmbeddedBroker(log_path=tmp_path / "broker.log")
    broker.start()
    try:
        done = subprocess.run([sys.executable, "-c", CHURN, broker.bootstrap_servers, uuid.uuid4().hex[:8]],
                              capture_output=True, text=True, timeout=240)
    finally:
        broker.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "read 8" in done.stdout, done.stdout
