"""Fire-rate limits on a real `chronos up`: a limited topic's messages are spread out at its rate,
an unlimited topic fires on time beside it, and status and metrics show the throttled backlog."""

from __future__ import annotations

import subprocess
import time
import urllib.request

import orjson
import pytest

from kits.stack import CHRONOS, ChronosUp, clean_env
from chronos.adapters.kafka.admin import create_topics
from chronos.telemetry.endpoints import pick_metrics_base
from helpers import Collector, chronos_headers, producer

RATE, COUNT = 50, 200


def status(up: ChronosUp) -> dict:
    out = subprocess.run(CHRONOS + ["status", "--json", "--ready-file", str(up.ready_file)], env=clean_env(),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return orjson.loads(out.stdout)


@pytest.mark.parametrize("claim", ["stamp", "delete"])
def test_a_limited_topic_is_spread_at_its_rate_by_two_firers_while_another_fires_at_once(tmp_path, claim):
    """Whichever way the firers claim (the claim that deletes sets its tokens aside in a transaction of their
    own, and gives back what it did not use)."""
    # every program's port free (one free port says nothing of base + 100, base + 101, ...)
    metrics_port = pick_metrics_base({"consumer": 1, "firer": 2, "detector": 1})
    # two firers: the limit is theirs together (each with a bucket of its own would take half the time)
    up = ChronosUp("--fire-rate-limits", f"fragile={RATE}", "--allowed-topics", "fragile|chronos.output",
               "--metrics-port", str(metrics_port), "--firers", "2", "--firer-claim", claim,
               workdir=tmp_path).launch()
    try:
        info = up.wait_ready()
        create_topics(info["bootstrap_servers"], {"fragile": 1})
        collect = Collector(info["bootstrap_servers"], ["fragile", info["output_topic"]])
        p = producer(info["bootstrap_servers"])
        deadline = time.time() + 15.0  # far enough for every message to be stored first, even on a loaded machine
        for i in range(COUNT):
            p.produce(info["input_topic"], b"f", headers=chronos_headers(f"f-{i}", deadline)
                      + [("chronosTopic", b"fragile")])
            p.produce(info["input_topic"], b"o", headers=chronos_headers(f"o-{i}", deadline))
        assert p.flush(30) == 0
        # every message stored before its deadline: one read late would be published by the consumer
        # at once, not through the limit
        while status(up)["waiting"] < 2 * COUNT:
            assert time.time() < deadline - 0.2, "the messages were not all stored before their deadline"
            time.sleep(0.1)

        # while the limited topic's backlog drains, status shows it
        throttled = None
        end = time.monotonic() + deadline - time.time() + 10
        while time.monotonic() < end and not throttled:
            collect.poll_for(0.2)
            if time.time() < deadline + 0.5:
                continue
            throttled = [t for t in status(up)["throttled"] if t["topic"] == "fragile" and t["rows"]]
        assert throttled, "chronos status never showed a throttled backlog"
        assert throttled[0]["rate_per_s"] == RATE and throttled[0]["lateness_s"] > 0

        got = collect.until(lambda ms: len(ms) >= 2 * COUNT, timeout=60)
        collect.close()
        fragile = sorted(m.at for m in got if m.topic == "fragile")
        other = sorted(m.at for m in got if m.topic == info["output_topic"])
        assert len(fragile) == len(other) == COUNT
        assert min(fragile + other) >= deadline - 0.05, "a message fired before its deadline"
        # the unlimited topic at once; the limited one: a bucketful at once, the rest at the rate
        assert other[-1] - deadline < 2.5
        spread = fragile[-1] - fragile[0]
        assert (COUNT - RATE) / RATE * 0.7 <= spread <= (COUNT - RATE) / RATE + 4, spread
        first_second = sum(1 for t in fragile if t < fragile[0] + 1.0)
        assert first_second <= 2 * RATE + 20, first_second  # a bucketful plus one second of the rate

        # the detector's gauges, per topic (read every few seconds)
        detector_port = metrics_port + 200
        end = time.monotonic() + 20
        body = ""
        while time.monotonic() < end and 'chronos_throttled_rows{' not in body:
            with urllib.request.urlopen(f"http://127.0.0.1:{detector_port}/metrics", timeout=5) as response:
                body = response.read().decode()
            time.sleep(0.5)
        assert 'topic="fragile"' in body.split("chronos_throttled_rows{", 1)[1].split("\n")[0], body
        assert "chronos_throttled_lateness_seconds{" in body
        assert up.stop() == 0
    finally:
        up.kill()
