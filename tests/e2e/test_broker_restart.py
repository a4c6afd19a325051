"""`chronos up` whose embedded broker is killed: it starts it again on the same port, recreates the
topics, says what the memory-only broker lost, and the stack goes on firing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import urllib.request

import orjson
import psycopg
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from kits.stack import CHRONOS, ChronosUp, clean_env
from chronos.adapters.kafka.brokerstats import read_stats
from chronos.telemetry.endpoints import pick_metrics_base
from helpers import Collector, chronos_headers, producer, wait_for

UNREAD = 5


def send(info_file: Path, *args: str) -> str:
    out = subprocess.run(CHRONOS + ["send", "--ready-file", str(info_file), *args], env=clean_env(),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def stored(database_url: str, message_id: str) -> bool:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT 1 FROM chronos_messages WHERE id = %s", (message_id,)).fetchone() is not None


def broker_metrics(port: int) -> dict[str, float]:
    """The detector's chronos_embedded_broker_* samples by name, once it serves them (it may be starting)."""
    def scrape() -> dict[str, float] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name.startswith("chronos_embedded_broker")} or None
    return wait_for(scrape, what=f"the detector's /metrics on port {port}")


def status_text(ready_file: Path) -> str:
    out = subprocess.run(CHRONOS + ["status", "--ready-file", str(ready_file)], env=clean_env(),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_killed_broker_is_started_again_and_says_what_it_lost(tmp_path):
    base = pick_metrics_base({"consumer": 1, "firer": 1, "detector": 1})
    # a threshold of 1 MB: the broker is above it from the start
    up = ChronosUp("--no-console", "--broker-memory-warning-mb", "1", workdir=tmp_path,
               env={"CHRONOS_METRICS_PORT": str(base)}).launch()
    try:
        info = up.wait_ready()
        stats_file = Path(info["broker_stats_file"])
        # a message stored before the kill, due after it
        send(up.ready_file, "--delay", "25s", "--value", "stored before", "--id", "stored-before")
        wait_for(lambda: stored(info["database_url"], "stored-before"), what="the message stored")
        # input messages nobody reads: the consumer is stopped
        up.supervisor().stop("consumer_00")
        p = producer(info["bootstrap_servers"])
        for i in range(UNREAD):
            p.produce(info["input_topic"], f"unread {i}".encode(),
                      headers=chronos_headers(f"unread-{i}-{uuid.uuid4()}", time.time() + 1))
        assert p.flush(10) == 0
        del p  # a client left connected would ask for the input topic's metadata as soon as the broker is
        # back, and the broker would create the topic itself with its own default partitions
        produced = time.time()
        wait_for(lambda: (s := read_stats(stats_file)) and s["sampled_at"] and s["sampled_at"] > produced
                 and s["input_unread"] == UNREAD, timeout=30, what="a sample that counts the unread messages")
        # what it holds and its memory, where operators look
        before = broker_metrics(base + 200)
        assert before["chronos_embedded_broker_unread_input_messages"] == UNREAD
        assert before["chronos_embedded_broker_messages"] == UNREAD + 1
        assert before["chronos_embedded_broker_rss_bytes"] > 1_000_000
        assert before["chronos_embedded_broker_restarts_total"] == 0
        assert before["chronos_embedded_broker_memory_warning_bytes"] == 2 ** 20
        warning = f"warning: the embedded broker (pid {info['broker_pid']}) uses "
        assert warning in up.output() and "above the warning threshold of 1 MB" in up.output(), up.output()
        assert warning in (up.log_dir / "broker.log").read_text(errors="replace")
        shown = status_text(up.ready_file)
        assert re.search(r"embedded broker +[\d.,]+ MB   pid \d+, memory only, frees no message; ABOVE the warning "
                         r"threshold \(1 MB\)", shown), shown
        assert re.search(rf"  messages held +{UNREAD + 1}   all topics; {UNREAD} input not read yet", shown), shown
        admin = AdminClient({"bootstrap.servers": info["bootstrap_servers"]})
        chronos_topics = (info["input_topic"], info["output_topic"], info["dlq_topic"])
        partitions = {name: len(admin.list_topics(timeout=10).topics[name].partitions) for name in chronos_topics}
        killed = info["broker_pid"]
        pids = {name: p["pid"] for name, p in up.programs().items()}
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: "started again on port" in up.output(), timeout=60, what="the restart line")
        up.check_alive()
        out = up.output()
        port = int(info["bootstrap_servers"].rsplit(":", 1)[1])
        line = re.search(rf"the embedded broker \(pid {killed}\) stopped unexpectedly \(killed by SIGKILL\); "
                         rf"started again on port {port}; it kept messages in memory only: about {UNREAD} input "
                         r"messages not yet read by the consumer group were lost \(last seen \d\d:\d\d:\d\d.*"
                         r"messages waiting in PostgreSQL are safe and fire as the programs start again", out)
        assert line, out
        assert line.group(0) in (up.log_dir / "broker.log").read_text(errors="replace")
        # the topics are there again, with the partitions they had (the programs were stopped meanwhile:
        # none of them could have the broker create one with its own default)
        topics = admin.list_topics(timeout=10).topics
        assert {name: len(topics[name].partitions) for name in chronos_topics} == partitions
        # the ready file and the stats file follow
        again = orjson.loads(up.ready_file.read_bytes())
        assert again["broker_pid"] not in (None, killed) and again["bootstrap_servers"] == info["bootstrap_servers"]
        stats = read_stats(stats_file)
        assert stats is not None and stats["restarts"] == 1 and stats["lost_input"] == UNREAD, stats
        assert stats["pid"] == again["broker_pid"]
        after = broker_metrics(base + 200)
        assert after["chronos_embedded_broker_restarts_total"] == 1
        assert after["chronos_embedded_broker_lost_input_messages_total"] == UNREAD
        assert re.search(rf"  broker restarts +1   about {UNREAD} unread input messages lost", status_text(up.ready_file))
        # the programs were started afresh (the consumer too, which the test had stopped): their
        # producers take ids of the new broker
        assert f"the embedded broker (pid {killed}) stopped unexpectedly (killed by SIGKILL); stopping the programs " \
               f"and starting it again on port {port}" in out
        assert up.all_running() == {}, up.programs()
        again_pids = {name: p["pid"] for name, p in up.programs().items()}
        assert all(again_pids[name] != pid for name, pid in pids.items()), (pids, again_pids)
        assert "was restarted by supervisord" not in up.output()
        # the stack goes on: a message sent now fires, and so does the one stored before the kill
        collect = Collector(info["bootstrap_servers"], [info["output_topic"]])
        try:
            send(up.ready_file, "--delay", "1s", "--value", "sent after")
            try:
                got = collect.until(lambda ms: {b"sent after", b"stored before"} <= {m.value for m in ms}, timeout=60)
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {[m.value for m in collect.messages]}\n" + "\n".join(
                    up.log(name)[-3000:] for name in ("consumer_00", "firer_00"))) from None
        finally:
            collect.close()
        assert not any(m.value.startswith(b"unread") for m in got if m.value)
        assert up.stop() == 0
        assert not stats_file.exists()
    finally:
        up.kill()
