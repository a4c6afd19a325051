"""Firers that claim with a delete (CHRONOS_FIRER_CLAIM=delete) as real OS processes, a real PostgreSQL, the
embedded broker: a firer killed mid-batch has its rows back at once, fired once more at most; a firer
frozen (SIGSTOP) has its transaction ended by PostgreSQL within the hold time, a peer fires its rows, and
it publishes nothing once thawed; a firer that deletes beside one that stamps loses nothing and fires
nothing early; status and `chronos list` tell the rows it holds in flight."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import orjson
import pytest

from helpers import Collector, chronos_headers, producer, send, wait_for
from kits.traffic import held_rows

DELETE = {"CHRONOS_FIRER_CLAIM": "delete"}
ADVANCE_S = 0.050      # CHRONOS_TIMING_ADVANCE_MS's default
HOLD_S = 3.0           # the tests' CHRONOS_HOLD_TIME_MS (tests/conftest.py)


@pytest.fixture
def collect(broker, topics):
    c = Collector(broker.bootstrap_servers, [topics["output"]])
    yield c
    c.close()


def node_of(processes, proc) -> str:
    found = re.search(r"starting: node ([0-9a-f-]{36})", processes.wait_for_log(proc, "starting: node"))
    assert found
    return found[1]


def start(processes, role: str, **env) -> tuple:
    """A process, once it has started its role: (the process, its node)."""
    proc = processes.start(role, **env)
    node = node_of(processes, proc)
    processes.wait_for_log(proc, "firing from the store" if role == "firer" else "starting: node")
    return proc, node


def send_due(broker, topics, n: int, deadline: float, prefix: str = "m") -> list[str]:
    p = producer(broker.bootstrap_servers)
    ids = [f"{prefix}-{i}" for i in range(n)]
    for mid in ids:
        send(p, topics["input"], b"k", mid.encode(), chronos_headers(mid, deadline))
    p.flush(10)
    return ids


def test_a_firer_killed_mid_batch_has_its_rows_back_at_once_and_fired_once_more_at_most(processes, broker, topics,
                                                                                           collect, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    start(processes, "consumer")
    # claims far ahead, so that it is killed holding rows it has not published
    doomed, node = start(processes, "firer", CHRONOS_LOOKAHEAD_MS="1400", CHRONOS_POLL_INTERVAL_MS="50", **DELETE)
    deadline = time.time() + 2.5
    ids = send_due(broker, topics, 20, deadline)
    held = wait_for(lambda: held_rows(url, node) if len(held_rows(url, node)) == 20 else None, 20, "20 rows held")
    assert set(held) == set(ids)
    os.kill(doomed.pid, signal.SIGKILL)
    killed_at = time.time()
    wait_for(lambda: not held_rows(url), 2.0, "the rows back (PostgreSQL rolls the killed firer's batch back)",
             every=0.02)
    assert time.time() - killed_at < HOLD_S   # back at once, not after the hold time
    start(processes, "firer", **DELETE)
    collect.until(lambda ms: {m.value.decode() for m in ms} >= set(ids), timeout=30)
    collect.poll_for(1.0)
    counts = {mid: sum(1 for m in collect.messages if m.value.decode() == mid) for mid in ids}
    assert set(counts.values()) <= {1, 2}, counts   # fired once more at most
    assert min(m.at for m in collect.messages) >= deadline - ADVANCE_S


def test_a_frozen_firer_s_batch_is_ended_by_postgresql_and_it_publishes_nothing_once_thawed(processes, broker, topics,
                                                                                              collect, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    start(processes, "consumer")
    frozen, node = start(processes, "firer", CHRONOS_LOOKAHEAD_MS="1400", CHRONOS_POLL_INTERVAL_MS="50", **DELETE)
    deadline = time.time() + 2.5
    ids = send_due(broker, topics, 20, deadline)
    wait_for(lambda: len(held_rows(url, node)) == 20, 20, "20 rows held", every=0.02)
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        stopped_at = time.time()
        start(processes, "firer", **DELETE)   # its peer, which takes the frozen firer's slices once its lease ends
        wait_for(lambda: not held_rows(url, node), HOLD_S + 3, "PostgreSQL to end the frozen firer's transaction",
                 every=0.05)
        assert time.time() - stopped_at < HOLD_S + 2
        collect.until(lambda ms: {m.value.decode() for m in ms} >= set(ids), timeout=30)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    thawed_at = time.time()
    processes.wait_for_log(frozen, "claimed more than", timeout=10)   # its rows, too old to publish
    collect.poll_for(2.0)
    assert sorted(m.value.decode() for m in collect.messages) == sorted(ids)   # each once: the peer's copies
    assert not [m for m in collect.messages if m.created >= thawed_at]
    assert frozen.poll() is None   # and it goes on


def test_a_firer_that_deletes_beside_one_that_stamps_loses_nothing_and_fires_nothing_early(processes, broker, topics,
                                                                                             collect):
    """The two kinds of firer on one store, as during a rollout from one to the other, with a detector."""
    for role, env in (("consumer", {}), ("firer", DELETE), ("firer", {"CHRONOS_FIRER_CLAIM": "stamp"}), ("detector", {})):
        start(processes, role, **env)
    p = producer(broker.bootstrap_servers)
    sent = {}
    now = time.time()
    for i in range(400):
        deadline = int((now + random.uniform(0.3, 4.0)) * 1000) / 1000
        okey = [("chronosOrderingKey", f"key-{i % 10}".encode())] if i % 3 == 0 else []
        send(p, topics["input"], b"k", f"v{i}".encode(), chronos_headers(f"mix-{i}", deadline, okey))
        sent[f"v{i}".encode()] = deadline
    p.flush(10)
    collect.until(lambda ms: {m.value for m in ms} >= set(sent), timeout=60)
    collect.poll_for(1.0)
    assert len(collect.messages) == len(sent)   # nothing twice
    for m in collect.messages:
        assert m.at >= sent[m.value] - ADVANCE_S, f"{m.value!r} early by {sent[m.value] - m.at:.3f}s"


def test_status_and_list_tell_the_rows_a_firer_that_deletes_holds_in_flight(processes, broker, topics, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    start(processes, "consumer")
    # a firer that claims 28 s ahead, and holds what it claimed until its deadline: 25 s for the commands below,
    # each a process of its own, on a busy machine
    _, node = start(processes, "firer", CHRONOS_LOOKAHEAD_MS="28000", CHRONOS_HOLD_TIME_MS="60000", **DELETE)
    ids = send_due(broker, topics, 5, time.time() + 25, prefix="held")
    send_due(broker, topics, 3, time.time() + 3600, prefix="later")
    wait_for(lambda: len(held_rows(url, node)) == 5, 20, "five rows held", every=0.05)

    def chronos(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "chronos", *args, "--json", "--database-url", url],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return orjson.loads(out.stdout)
    status = chronos("status", "--hold-time-ms", "60000")
    assert (status["in_flight"], status["waiting"]) == (5, 3)
    assert [(n["node"], n["rows"]) for n in status["in_flight_by_node"]] == [(node, 5)]
    listed = chronos("list", "--state", "in_flight", "--hold-time-ms", "60000")["messages"]
    assert sorted(m["id"] for m in listed) == sorted(ids) and {m["firer"] for m in listed} == {node}
    assert [m["id"] for m in chronos("list", "--state", "waiting")["messages"]] == ["later-0", "later-1", "later-2"]
    shown = chronos("show", ids[0])
    assert (shown["state"], shown["firer"]) == ("in_flight", node)
