"""`chronos tail` without --from-beginning prints what arrives from now on, not what the topic already held."""

from __future__ import annotations

import subprocess
import sys
import time

from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS

from helpers import producer


def test_tail_prints_what_arrives_after_it_started_and_not_before(broker, topics):
    p = producer(broker.bootstrap_servers)
    for i in range(3):
        p.produce(topics["output"], key=b"old", value=f"before-{i}".encode())
    p.flush(10)
    tail = subprocess.Popen([sys.executable, "-m", "chronos", "tail", "--count", "1", "--timeout", "60",
                             "--kafka-bootstrap-servers", broker.bootstrap_servers, "--output-topic", topics["output"],
                             "--kafka-properties", ",".join(f"{k}={v}" for k, v in EMBEDDED_GROUP_TIMEOUTS.items())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4.0)  # it has joined its group and chosen where to start
        p.produce(topics["output"], key=b"new", value=b"after")
        p.flush(10)
        out, err = tail.communicate(timeout=90)
    finally:
        if tail.poll() is None:
            tail.kill()
    assert tail.returncode == 0, err
    assert "key='new' value='after'" in out and "before" not in out, out + err
