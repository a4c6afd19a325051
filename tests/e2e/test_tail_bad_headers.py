"""`chronos tail` prints a message whose header name is not UTF-8 instead of crashing on it."""

from __future__ import annotations

import subprocess
import sys

from rdkafka_raw import RawProducer

from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS


def test_tail_reads_past_a_header_name_that_is_not_utf8(broker, topics):
    raw = RawProducer(broker.bootstrap_servers)
    try:
        raw.produce(topics["output"], b"bad", b"first", [(b"\xff\xfe", b"v")], partition=0)
        raw.produce(topics["output"], b"good", b"second", [(b"trace", b"1")], partition=0)
        raw.flush()
    finally:
        raw.close()
    run = subprocess.run([sys.executable, "-m", "chronos", "tail", "--from-beginning", "--count", "2",
                          "--timeout", "60", "--kafka-bootstrap-servers", broker.bootstrap_servers,
                          "--output-topic", topics["output"],
                          # the embedded broker's group join waits half the session timeout
                          "--kafka-properties", ",".join(f"{k}={v}" for k, v in EMBEDDED_GROUP_TIMEOUTS.items())],
                         capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2, run.stdout + run.stderr
    assert "key='bad' value='first'" in lines[0] and "key='good' value='second'" in lines[1]
