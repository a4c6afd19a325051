"""What the other schedulers offer, end to end: destination topics, the client, ordering keys,
cancel and replace, the lateness limit, recurring schedules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import orjson
import psycopg
import pytest

from chronos.client import Scheduler
from chronos.adapters.kafka.admin import create_topics
from helpers import Collector, chronos_headers, producer, send, start_consumer_and_doomed_firer, wait_for
from kits.traffic import held_rows


def start_all(processes, firers=1, **env):
    procs = [processes.start("consumer", **env)] + [processes.start("firer", **env) for _ in range(firers)] + \
        [processes.start("detector", **env)]
    for p in procs:
        processes.wait_for_log(p, "starting: node")
    return procs


def rows(url, where="true"):
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT id FROM chronos_messages WHERE {where} ORDER BY id").fetchall()


@pytest.fixture
def scheduler(broker, topics):
    s = Scheduler(broker.bootstrap_servers, input_topic=topics["input"])
    yield s
    s.flush()


# -- destination per message, the client, long delays -------------------------------------------

def test_destination_topic_must_match_the_allowed_pattern(processes, broker, topics, scheduler):
    billing = f"billing.{uuid.uuid4().hex[:6]}"
    create_topics(broker.bootstrap_servers, {billing: 2, "payments-secret": 1})
    start_all(processes, CHRONOS_ALLOWED_TOPICS=rf"billing\..*|{topics['output']}")
    collect = Collector(broker.bootstrap_servers, [billing, topics["dlq"], "payments-secret"])
    scheduler.send_later(b"k", b"to-billing", topic=billing, delay=0.5)
    scheduler.send_later(b"k", b"to-secret", topic="payments-secret", delay=0.5)
    scheduler.flush()
    got = collect.until(lambda ms: len(ms) >= 2, timeout=30)
    collect.poll_for(1)
    collect.close()
    by_topic = {m.topic: m for m in got}
    assert set(by_topic) == {billing, topics["dlq"]}
    assert by_topic[billing].value == b"to-billing"
    assert by_topic[topics["dlq"]].header_dict["chronosError"].startswith(b"topic_not_allowed")


def test_send_later_cancel_replace_and_a_two_year_delay(processes, broker, topics, scheduler, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    start_all(processes)
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    keep = scheduler.send_later("k1", "kept", delay=timedelta(seconds=1.5), headers=[("trace", b"t1")])
    gone = scheduler.send_later("k2", "cancelled", delay=2.0)
    changed = scheduler.send_later("k3", "original", delay=2.0)
    far = scheduler.send_later("k4", "in two years", when=datetime.now(timezone.utc) + timedelta(days=730))
    scheduler.flush()
    wait_for(lambda: len(rows(url)) == 4, 20, "4 rows stored", every=0.05)
    scheduler.cancel(gone)
    scheduler.cancel("never-scheduled")                      # ignored and counted
    scheduler.replace("k3", "replaced", delay=1.0, message_id=changed)
    scheduler.flush()
    got = collect.until(lambda ms: len(ms) >= 2, timeout=30)
    collect.poll_for(2.0)
    collect.close()
    assert sorted((m.key, m.value) for m in collect.messages) == [(b"k1", b"kept"), (b"k3", b"replaced")]
    assert next(m for m in got if m.key == b"k1").headers == [("trace", b"t1")]
    assert rows(url) == [(far,)]                             # the two-year message waits in the store
    assert keep and len(far) == 36


def test_replace_of_an_unknown_id_schedules_it(processes, broker, topics, scheduler):
    start_all(processes)
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    scheduler.replace(b"k", b"new", delay=0.5, message_id="brand-new")
    scheduler.flush()
    (m,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    collect.close()
    assert m.value == b"new"


def test_max_lateness_dead_letters_messages_too_far_in_the_past(processes, broker, topics):
    start_all(processes, CHRONOS_MAX_LATENESS_MS="60000")
    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    p = producer(broker.bootstrap_servers)
    send(p, topics["input"], b"k", b"a bit late", chronos_headers("late-ok", time.time() - 10))
    send(p, topics["input"], b"k", b"far too late", chronos_headers("late-no", time.time() - 3600))
    p.flush(10)
    got = collect.until(lambda ms: len(ms) >= 2, timeout=30)
    collect.close()
    by_topic = {m.topic: m for m in got}
    assert by_topic[topics["output"]].value == b"a bit late"
    assert by_topic[topics["dlq"]].header_dict["chronosError"].startswith(b"too_late")


# -- ordering keys ----------------------------------------------------------------------------------

@pytest.mark.parametrize("claim", ["stamp", "delete"])
def test_ordering_keys_hold_with_several_firers_and_a_firer_killed_mid_batch(processes, broker, topics,
                                                                           chronos_env, claim):
    """With the claim that deletes, a row a firer holds holds back the later rows of its key as a stamped
    one does, and the killed firer's rows are back at once."""
    url = chronos_env["CHRONOS_DATABASE_URL"]
    env = {"CHRONOS_FIRER_CLAIM": claim}
    # one firer claims far ahead, so it is killed holding whole chains of keys
    consumer, doomed = start_consumer_and_doomed_firer(processes, **env)
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    p = producer(broker.bootstrap_servers)
    deadline = time.time() + 2.5
    keys = [f"order-{k}" for k in range(20)]
    for i in range(8):
        for k in keys:   # equal deadlines: the enqueue order is the order
            send(p, topics["input"], k.encode(), f"{k}:{i}".encode(),
                 chronos_headers(f"{k}-{i}", deadline, [("chronosOrderingKey", k.encode())]))
    p.flush(10)
    wait_for(lambda: held_rows(url), 20, "a row claimed", every=0.05)
    os.kill(doomed.pid, signal.SIGKILL)
    for _ in range(3):
        processes.start("firer", **env)
    processes.start("detector")
    collect.until(lambda ms: len({m.value for m in ms}) >= 160, timeout=60)
    collect.close()
    for k in keys:
        seen = []
        for m in collect.messages:
            key, i = m.value.decode().split(":")
            if key == k and int(i) not in seen:
                seen.append(int(i))   # first deliveries; a repeat is a duplicate after the kill
        assert seen == list(range(8)), (k, seen)


# -- recurring schedules ---------------------------------------------------------------------------

@pytest.mark.parametrize("claim", ["stamp", "delete"])
def test_recurring_schedule_fires_occurrences_and_can_be_cancelled(processes, broker, topics, chronos_env, claim):
    """A firer that claims with a delete still stamps the occurrences it creates (a schedule is advanced, not
    deleted)."""
    url = chronos_env["CHRONOS_DATABASE_URL"]
    start_all(processes, firers=2, CHRONOS_FIRER_CLAIM=claim)
    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    p = producer(broker.bootstrap_servers)
    send(p, topics["input"], b"k", b"tick", [("chronosMessageId", b"every-minute"), ("chronosCron", b"* * * * *"),
                                            ("chronosTimeZone", b"Europe/Paris"), ("x", b"1")])
    send(p, topics["input"], b"k", b"bad", [("chronosMessageId", b"bad"), ("chronosCron", b"99 * * * *")])
    p.flush(10)
    wait_for(lambda: rows(url, "cron IS NOT NULL") == [("every-minute",)], 20, "the schedule stored", every=0.05)
    # instead of waiting for the next minute: make the schedule due, as if an occurrence came
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_messages SET deadline = date_trunc('minute', now()) WHERE id = 'every-minute'")
    got = collect.until(lambda ms: len(ms) >= 2, timeout=30)
    occ = next(m for m in got if m.topic == topics["output"])
    assert occ.value == b"tick" and occ.headers[0] == ("x", b"1")
    stamp = occ.header_dict["chronosOccurrence"].decode()
    assert stamp.endswith(":00.000000Z")
    dead = next(m for m in got if m.topic == topics["dlq"])
    assert dead.header_dict["chronosError"].startswith(b"bad_cron")
    with psycopg.connect(url) as conn:
        (nxt,) = conn.execute("SELECT deadline FROM chronos_messages WHERE id = 'every-minute'").fetchone()
    assert nxt > datetime.now(timezone.utc)          # moved on to the next occurrence
    out = subprocess.run([sys.executable, "-m", "chronos", "schedules", "--json", "--database-url", url],
                         capture_output=True, text=True, timeout=30)
    (listed,) = orjson.loads(out.stdout)
    assert listed["id"] == "every-minute" and listed["cron"] == "* * * * *" and listed["timezone"] == "Europe/Paris"
    send(p, topics["input"], None, None, [("chronosMessageId", b"every-minute"), ("chronosAction", b"cancel")])
    p.flush(10)
    wait_for(lambda: rows(url, "cron IS NOT NULL") == [], 20, "the schedule cancelled", every=0.05)
    collect.close()


def test_missed_occurrences_fire_once_after_an_outage(processes, broker, topics, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    consumer = processes.start("consumer")
    processes.wait_for_log(consumer, "starting: node")
    p = producer(broker.bootstrap_servers)
    send(p, topics["input"], b"k", b"tick", [("chronosMessageId", b"ten"), ("chronosCron", b"*/10 * * * *")])
    p.flush(10)
    wait_for(lambda: rows(url, "cron IS NOT NULL") == [("ten",)], 20, "the schedule stored", every=0.05)
    with psycopg.connect(url, autocommit=True) as conn:   # nothing fired for five hours
        conn.execute("UPDATE chronos_messages SET deadline = date_trunc('hour', now()) - interval '5 hours'")
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    started = datetime.now(timezone.utc)
    processes.start("firer")
    collect.until(lambda ms: len(ms) >= 1, timeout=30)
    collect.poll_for(2)
    collect.close()
    occurrences = [datetime.fromisoformat(m.header_dict["chronosOccurrence"].decode().replace("Z", "+00:00"))
                   for m in collect.messages]
    # thirty occurrences were missed and one fires; the next one fires too if its time comes meanwhile
    assert sum(o < started for o in occurrences) <= 1 and 1 <= len(occurrences) <= 2
    assert len(set(occurrences)) == len(occurrences)


def test_client_context_manager_flushes(broker, topics):
    collect = Collector(broker.bootstrap_servers, [topics["input"]])
    with Scheduler(broker.bootstrap_servers, input_topic=topics["input"],
                   config={"linger.ms": "100"}) as s:
        mid = s.send_later(None, b"v", delay=5, ordering_key="o", message_id="given-id")
    assert mid == "given-id"
    (m,) = collect.until(lambda ms: len(ms) >= 1, timeout=20)
    collect.close()
    h = m.header_dict
    assert h["chronosMessageId"] == b"given-id" and h["chronosOrderingKey"] == b"o"
    assert datetime.fromisoformat(h["chronosDeadline"].decode().replace("Z", "+00:00")) > datetime.now(timezone.utc)
