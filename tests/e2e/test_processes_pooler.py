"""The three processes behind Debian's PgBouncer in transaction mode (kits/pgbouncer.py): with the
default CHRONOS_DATABASE_POOL_MODE=auto they find it and deliver; told `session`, a process ends with one
line naming the setting instead of crash-looping, and `chronos up` refuses before it says `ready`."""

from __future__ import annotations

import contextlib
import time

import psycopg
import pytest

from kits.stack import ChronosUp
from helpers import Collector, chronos_headers, producer, send, wait_for
from kits.pgbouncer import PgBouncer

MISMATCH = "set CHRONOS_DATABASE_POOL_MODE=transaction"


@pytest.fixture
def pooler(pg_server):
    """PgBouncer in transaction mode that lends its idle server connections in turn, four of them open
    once a test warms it: consecutive transactions of one client land on different server connections,
    so whatever a process wrongly kept on one is missing from the next."""
    with PgBouncer(pg_server.port, "transaction", server_round_robin="1") as bouncer:
        yield bouncer


def warm(url: str, servers: int = 4) -> None:
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(psycopg.connect(url, autocommit=True, prepare_threshold=None))
                 for _ in range(servers)]
        for conn in conns:
            conn.execute("BEGIN")
        for conn in conns:
            conn.execute("COMMIT")


def stored(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT count(*) FROM chronos_messages").fetchone()[0]


def test_the_processes_find_a_pooler_in_transaction_mode_and_deliver(processes, broker, topics, pooler,
                                                                     database_url):
    url = pooler.url(database_url)
    warm(url)
    procs = [processes.start(role, CHRONOS_DATABASE_URL=url) for role in ("consumer", "firer", "detector")]
    for proc in procs:
        processes.wait_for_log(proc, "reached through a pooler in transaction mode")
    processes.wait_for_log(procs[1], "firing from the store")
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    try:
        p = producer(broker.bootstrap_servers)
        deadline = time.time() + 2.0
        for i in range(5):
            send(p, topics["input"], b"k", f"v{i}".encode(), chronos_headers(f"m-{i}", deadline))
        p.flush(10)
        wait_for(lambda: stored(database_url) == 5, timeout=15, what="5 rows stored")
        # a batch the consumer writes through its staging table, made in its transaction: an id already
        # waiting (left as it is) and a replace
        send(p, topics["input"], b"k", b"v1-again", chronos_headers("m-1", deadline))
        send(p, topics["input"], b"k", b"v5", chronos_headers("m-5", deadline, [("chronosAction", b"replace")]))
        p.flush(10)
        got = collect.until(lambda ms: len(ms) >= 6, timeout=30)
        collect.poll_for(1.0)
    finally:
        collect.close()
    assert sorted(m.value for m in got) == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]
    assert all(proc.poll() is None for proc in procs), [processes.log_of(proc)[-2000:] for proc in procs]


def test_told_session_behind_a_pooler_in_transaction_mode_a_process_stops_with_one_line(processes, pooler,
                                                                                     database_url):
    url = pooler.url(database_url)
    warm(url)
    env = {"CHRONOS_DATABASE_URL": url, "CHRONOS_DATABASE_POOL_MODE": "session"}
    firer, detector = processes.start("firer", **env), processes.start("detector", **env)
    for proc in (firer, detector):
        assert proc.wait(30) == 2  # a configuration error: supervisord does not restart it
        log = processes.log_of(proc)
        errors = [line for line in log.splitlines() if "ERROR" in line]
        assert len(errors) == 1 and MISMATCH in errors[0], log
        assert "Traceback" not in log


def test_up_told_session_behind_a_pooler_in_transaction_mode_refuses_before_ready(tmp_path, pooler, database_url):
    up = ChronosUp("--database-url", pooler.url(database_url), "--database-pool-mode", "session",
               workdir=tmp_path).launch()
    try:
        code, out = up.proc.wait(30), up.output()
    finally:
        up.kill()
    assert code == 2
    assert "CHRONOS_DATABASE_POOL_MODE=session, but PostgreSQL at" in out and \
        "set CHRONOS_DATABASE_POOL_MODE=transaction or auto" in out
    assert not any(line.startswith("ready ") for line in out.splitlines()) and "started embedded" not in out
