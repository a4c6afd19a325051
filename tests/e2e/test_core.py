"""The three processes as real OS processes, a real PostgreSQL, the embedded broker."""

from __future__ import annotations

import os
import random
import signal
import time

import psycopg
import pytest

from helpers import Collector, chronos_headers, producer, send, start_consumer_and_doomed_firer, wait_for

ADVANCE_S = 0.050  # default CHRONOS_TIMING_ADVANCE_MS


def start_all(processes, consumers=1, firers=1, detectors=1, **env):
    procs = [processes.start("consumer", **env) for _ in range(consumers)]
    procs += [processes.start("firer", **env) for _ in range(firers)]
    procs += [processes.start("detector", **env) for _ in range(detectors)]
    for p in procs:
        processes.wait_for_log(p, "starting: node")
    return procs


@pytest.fixture
def collect(broker, topics):
    c = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    yield c
    c.close()


@pytest.mark.parametrize("impl", ["native", "python"])
def test_mixed_delays_all_arrive_once_never_early(processes, broker, topics, collect, impl):
    start_all(processes, firers=2, CHRONOS_IMPL=impl)
    p = producer(broker.bootstrap_servers)
    sent = {}
    now = time.time()
    for i in range(300):
        deadline = now + random.uniform(0.5, 6.0) if i % 10 else now - 1.0  # some already late
        deadline = int(deadline * 1000) / 1000  # what the header says: milliseconds
        mid = f"msg-{i}"
        headers = chronos_headers(mid, deadline, [("trace", f"t{i}".encode()), ("dup", b"1"), ("dup", b"\x00\xff"),
                                                  ("nullval", None)])
        send(p, topics["input"], f"key-{i % 7}".encode(), f"value-{i}".encode(), headers)
        sent[mid] = (deadline, i)
    p.flush(10)
    out = collect.until(lambda ms: len([m for m in ms if m.topic == topics["output"]]) >= 300, timeout=60)
    collect.poll_for(1.0)  # anything extra would be a duplicate
    got = [m for m in collect.messages if m.topic == topics["output"]]
    assert len(got) == 300
    values = sorted(m.value for m in got)
    assert values == sorted(f"value-{i}".encode() for i in range(300))
    by_value = {m.value: m for m in got}
    for mid, (deadline, i) in sent.items():
        m = by_value[f"value-{i}".encode()]
        # Chronos headers removed; every other header in order, duplicates and binary/null values kept
        assert m.headers == [("trace", f"t{i}".encode()), ("dup", b"1"), ("dup", b"\x00\xff"), ("nullval", None)]
        assert m.key == f"key-{i % 7}".encode()
        # never before deadline - timing advance (the read time is after the publish)
        assert m.at >= deadline - ADVANCE_S, f"{mid} early by {deadline - m.at:.3f}s"
    assert not [m for m in out if m.topic == topics["dlq"]]


def test_null_key_and_tombstone_pass_through(processes, broker, topics, collect):
    start_all(processes)
    p = producer(broker.bootstrap_servers)
    send(p, topics["input"], None, None, chronos_headers("tomb", time.time() + 0.5))
    p.flush(10)
    (m,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    assert (m.key, m.value, m.headers) == (None, None, [])


def test_duplicate_id_is_ignored_while_waiting(processes, broker, topics, collect, chronos_env):
    start_all(processes)
    p = producer(broker.bootstrap_servers)
    deadline = time.time() + 3
    send(p, topics["input"], b"k", b"first", chronos_headers("same", deadline))
    p.flush(10)
    _wait_rows(chronos_env["CHRONOS_DATABASE_URL"], 1)
    send(p, topics["input"], b"k", b"second", chronos_headers("same", deadline + 1))
    p.flush(10)
    collect.until(lambda ms: len(ms) >= 1, timeout=30)
    collect.poll_for(2.5)
    assert [m.value for m in collect.messages] == [b"first"]


def test_late_message_is_delivered_at_once(processes, broker, topics, collect):
    start_all(processes)
    p = producer(broker.bootstrap_servers)
    sent_at = time.time()
    send(p, topics["input"], b"k", b"late", chronos_headers("late-1", sent_at - 3600))
    p.flush(10)
    (m,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    assert m.value == b"late" and m.topic == topics["output"]
    assert m.at - sent_at < 5


@pytest.mark.parametrize("headers,reason", [
    ([("chronosDeadline", b"1700000000000")], "missing_id"),
    ([("chronosMessageId", b"x")], "missing_deadline"),
    ([("chronosMessageId", b"x"), ("chronosDeadline", b"tomorrow")], "bad_deadline"),
    ([("chronosMessageId", b"x" * 129), ("chronosDeadline", b"1700000000000")], "id_too_long"),
])
def test_invalid_messages_reach_the_dead_letter_topic(processes, broker, topics, collect, headers, reason):
    start_all(processes)
    p = producer(broker.bootstrap_servers)
    send(p, topics["input"], b"orig-key", b"orig-value", headers + [("other", b"\x01")])
    p.flush(10)
    (m,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    assert m.topic == topics["dlq"]
    assert (m.key, m.value) == (b"orig-key", b"orig-value")
    assert m.headers[:len(headers) + 1] == headers + [("other", b"\x01")]
    assert m.header_dict["chronosError"].decode().startswith(reason)


def test_killed_firer_rows_are_fired_by_a_peer_after_the_hold_time(processes, broker, topics, collect,
                                                                  chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    # a firer that claims far ahead, so it holds rows it has not published when it dies; it stamps them, so
    # a detector hands them back (the claim that deletes: tests/e2e/test_delete_claim.py)
    consumer, doomed = start_consumer_and_doomed_firer(processes, CHRONOS_FIRER_CLAIM="stamp")
    p = producer(broker.bootstrap_servers)
    deadline = time.time() + 2.5
    for i in range(20):
        send(p, topics["input"], b"k", f"v{i}".encode(), chronos_headers(f"held-{i}", deadline))
    p.flush(10)
    wait_for(lambda: _count(url, "readied_at IS NOT NULL") == 20, 20, "20 rows claimed", every=0.05)
    os.kill(doomed.pid, signal.SIGKILL)
    killed_at = time.time()
    detector = processes.start("detector")
    peer = processes.start("firer")
    out = collect.until(lambda ms: len(ms) >= 20, timeout=30)
    assert sorted(m.value for m in out) == sorted(f"v{i}".encode() for i in range(20))
    # taken over only after the hold time (3 s in the tests) since they were readied
    assert min(m.at for m in out) >= killed_at + 1.0
    processes.wait_for_log(detector, "suspected failure of")
    assert peer.poll() is None


def test_processes_refuse_an_unmigrated_database(processes, empty_database_url):
    proc = processes.start("firer", CHRONOS_DATABASE_URL=empty_database_url)
    assert proc.wait(30) == 4
    assert "run `chronos migrate`" in processes.log_of(proc)


def test_sigterm_stops_every_role_cleanly(processes):
    procs = start_all(processes)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(20) == 0
        assert "stopping" in processes.log_of(proc)


def _count(url, where="true") -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT count(*) FROM chronos_messages WHERE {where}").fetchone()[0]


def _wait_rows(url, n, timeout=20) -> None:
    wait_for(lambda: _count(url) >= n, timeout, f"{n} rows stored", every=0.05)

