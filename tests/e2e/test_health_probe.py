"""A process's Kafka health probe has no side effect on the broker: a real firer against the real broker.

The firer's probe goes through its producer, and a producer's metadata request for one topic lets the
broker create that topic when it is missing. Asked that way, the probe brought a deleted output topic back
within a second, with the broker's default partitions; it now asks for every topic's metadata, which
creates none, and still tells whether Kafka answers.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import orjson

from chronos.adapters.kafka.admin import admin_client

from helpers import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthz(port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return orjson.loads(answer.read())
    except urllib.error.HTTPError as unhealthy:  # 503 carries the report too
        return orjson.loads(unhealthy.read())


def test_the_firers_probe_does_not_bring_back_a_deleted_output_topic(processes, broker, topics):
    port = free_port()
    # a 2 s health window: the probe asks every second
    firer = processes.start("firer", CHRONOS_METRICS_PORT=str(port), CHRONOS_HEALTH_WINDOW_MS="2000")
    processes.wait_for_log(firer, "serving /metrics")
    wait_for(lambda: healthz(port)["checks"].get("kafka", {}).get("age_s") is not None, timeout=20,
             what="the firer's Kafka probe answered")
    admin = admin_client(broker.bootstrap_servers)
    output = topics["output"]
    admin.delete_topics([output])[output].result()
    time.sleep(4.0)  # four probes
    assert output not in admin.list_topics(timeout=10).topics
    assert healthz(port)["checks"]["kafka"]["ok"]
    assert firer.poll() is None
