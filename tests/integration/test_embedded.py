"""Integration tests of chronos.embedded: real PostgreSQL and broker processes."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from chronos.adapters.kafka.admin import create_topics
from chronos.embedded import procs
from chronos.embedded.broker import EmbeddedBroker
from chronos.embedded.postgres import EmbeddedPostgres
from chronos.embedded.procs import EmbeddedError, free_port, port_in_use
from helpers import wait_exited


def _group_gone(pgid: int) -> bool:
    return not procs.group_alive(pgid)


@pytest.fixture
def listener():
    """A port occupied by a listening socket."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


# -- helpers -------------------------------------------------------------------------------------

def _start_and_find_data(pg, what: str) -> None:
    """Start PostgreSQL again on its data directory and find the row written before."""
    t0 = time.monotonic()
    pg.start()
    print(f"postgres {what}: {time.monotonic() - t0:.2f}s")
    with psycopg.connect(pg.url) as conn:
        assert conn.execute("select x from kept").fetchall() == [(42,)]


def test_free_port_and_port_in_use(listener):
    port = free_port()
    assert 0 < port < 65536
    assert not port_in_use(port)
    assert port_in_use(listener)


# -- PostgreSQL ----------------------------------------------------------------------------------


def test_postgres_restart_keeps_data_and_survives_kill(tmp_path):
    data = tmp_path / "pg" / "data"
    pg = EmbeddedPostgres(data, fast=True)
    assert pg.url == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    assert not pg.running and pg.pid is None

    t0 = time.monotonic()
    pg.start()
    print(f"\npostgres first start (initdb, fast): {time.monotonic() - t0:.2f}s")
    assert pg.running
    pid = pg.pid
    with psycopg.connect(pg.url, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        assert conn.execute("show fsync").fetchone() == ("off",)
        assert conn.execute("show listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("show max_connections").fetchone() == ("200",)
        conn.execute("create table kept (x int)")
        conn.execute("insert into kept values (42)")
    assert (tmp_path / "pg" / "postgres.log").exists()
    pg.stop()
    assert not pg.running
    assert wait_exited(pid) and _group_gone(pid)
    assert not (data / "postmaster.pid").exists()

    # restart on the same data directory: data kept
    _start_and_find_data(pg, "restart")

    # SIGKILL (crash) leaves a stale postmaster.pid: the next start must not mind
    pid = pg.pid
    conn = psycopg.connect(pg.url)  # a backend (own session) that kill() must take down too
    children = procs.descendants(pid)
    assert children
    pg.kill()
    conn.close()
    assert not pg.running
    assert wait_exited(pid) and _group_gone(pid)
    assert all(wait_exited(c, timeout=0.5) for c in children)
    assert (data / "postmaster.pid").exists()
    _start_and_find_data(pg, "start after kill")
    pid = pg.pid
    pg.kill()

    # stale postmaster.pid whose pid now belongs to an unrelated live process
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        pid_file = data / "postmaster.pid"
        lines = pid_file.read_text().splitlines()
        lines[0] = str(sleeper.pid)
        pid_file.write_text("\n".join(lines) + "\n")
        with pg:
            with psycopg.connect(pg.url) as conn:
                assert conn.execute("select count(*) from kept").fetchone() == (1,)
            pid = pg.pid
    finally:
        sleeper.kill()
        sleeper.wait()
    assert wait_exited(pid)
    pg.stop()  # idempotent


def test_postgres_second_server_on_same_data_dir_is_refused(tmp_path):
    data = tmp_path / "data"
    with EmbeddedPostgres(data, fast=True) as pg:
        other = EmbeddedPostgres(data, fast=True)
        t0 = time.monotonic()
        with pytest.raises(EmbeddedError, match="in use by a running PostgreSQL"):
            other.start()
        assert time.monotonic() - t0 < 5
        assert not other.running
        with psycopg.connect(pg.url) as conn:  # the first one is unharmed
            conn.execute("select 1")


def test_postgres_durable_mode(tmp_path):
    pg = EmbeddedPostgres(tmp_path / "data", log_path=tmp_path / "logs" / "pg.log")
    t0 = time.monotonic()
    with pg:
        print(f"\npostgres first start (initdb, durable): {time.monotonic() - t0:.2f}s")
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("show fsync").fetchone() == ("on",)
            assert conn.execute("show synchronous_commit").fetchone() == ("on",)
            assert conn.execute("show full_page_writes").fetchone() == ("on",)
            # fewer checkpoints and larger WAL buffers than PostgreSQL's defaults (1GB, 5min, 4MB)
            for name, value in {"max_wal_size": "4GB", "checkpoint_timeout": "15min", "wal_buffers": "16MB"}.items():
                assert conn.execute(f"show {name}").fetchone() == (value,)
    assert (tmp_path / "logs" / "pg.log").stat().st_size > 0


@pytest.mark.parametrize("seen", ["before the start", "in the server's log"])
@pytest.mark.parametrize("service", ["postgres", "broker"])
def test_a_port_in_use_is_a_clear_error(tmp_path, listener, monkeypatch, service, seen):
    if seen == "in the server's log":  # the port gets taken between our check and the server's bind
        monkeypatch.setattr(procs, "port_in_use", lambda port: False)
    server = EmbeddedPostgres(tmp_path / "data", port=listener, fast=True) if service == "postgres" \
        else EmbeddedBroker(listener)
    t0 = time.monotonic()
    with pytest.raises(EmbeddedError, match=f"^port {listener} is already in use") as ei:
        server.start()
    if seen == "before the start":
        assert time.monotonic() - t0 < 1
    else:
        assert time.monotonic() - t0 < 10  # PostgreSQL's includes initdb
        assert service != "postgres" or "Address already in use" in str(ei.value)
    assert not server.running


def test_postgres_broken_data_dir(tmp_path):
    not_pg = tmp_path / "not_pg"
    not_pg.mkdir()
    (not_pg / "some_file").write_text("hello")
    with pytest.raises(EmbeddedError, match="not empty but has no PG_VERSION"):
        EmbeddedPostgres(not_pg, fast=True).start()
    assert (not_pg / "some_file").read_text() == "hello"  # left alone

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "PG_VERSION").write_text("\x00garbage\n")
    with pytest.raises(EmbeddedError, match="PG_VERSION contains"):
        EmbeddedPostgres(corrupt, fast=True).start()

    old = tmp_path / "old"
    old.mkdir()
    (old / "PG_VERSION").write_text("9.6\n")
    with pytest.raises(EmbeddedError, match="created by PostgreSQL 9.6"):
        EmbeddedPostgres(old, fast=True).start()

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(EmbeddedError, match="not a directory"):
        EmbeddedPostgres(a_file, fast=True).start()


def test_postgres_exit_during_startup_reports_log(tmp_path):
    data = tmp_path / "data"
    with EmbeddedPostgres(data, fast=True):
        pass
    # a setting the server rejects at startup
    (data / "postgresql.auto.conf").write_text("shared_buffers = 'lots'\n")
    pg = EmbeddedPostgres(data, fast=True)
    t0 = time.monotonic()
    with pytest.raises(EmbeddedError, match="exited during startup") as ei:
        pg.start()
    assert "shared_buffers" in str(ei.value)
    assert "\n" not in str(ei.value)
    assert time.monotonic() - t0 < 5
    assert not pg.running


# -- broker --------------------------------------------------------------------------------------


def test_broker_topics_produce_consume(tmp_path):
    from confluent_kafka import Consumer, Producer

    log_path = tmp_path / "broker.log"
    broker = EmbeddedBroker(log_path=log_path)
    assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
    t0 = time.monotonic()
    broker.start()
    print(f"\nbroker start: {time.monotonic() - t0:.3f}s")
    pid = broker.pid
    try:
        topic = f"t-{uuid.uuid4().hex[:8]}"
        create_topics(broker.bootstrap_servers, {topic: 4}, {"retention.ms": 3600000})
        create_topics(broker.bootstrap_servers, {topic: 4})  # already there: fine

        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        headers = [("h1", b"v1"), ("h2", b"\x00\xff"), ("h1", b"again")]
        producer.produce(topic, key=b"k", value=b"hello", headers=headers, partition=2)
        assert producer.flush(10) == 0

        consumer = Consumer({
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 10,
        })
        try:
            md = consumer.list_topics(timeout=5)
            assert len(md.topics[topic].partitions) == 4
            consumer.subscribe([topic])
            msg = None
            deadline = time.monotonic() + 20
            while msg is None and time.monotonic() < deadline:
                m = consumer.poll(0.2)
                if m is not None:
                    assert m.error() is None, m.error()
                    msg = m
            assert msg is not None, "no message consumed"
            assert (msg.key(), msg.value(), msg.partition()) == (b"k", b"hello", 2)
            assert msg.headers() == headers
        finally:
            consumer.close()

        broker.pause()
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        broker.resume()
    finally:
        t0 = time.monotonic()
        broker.stop()
        print(f"broker stop: {time.monotonic() - t0:.3f}s")
    assert not broker.running and broker.pid is None
    assert wait_exited(pid)
    assert log_path.exists()


def test_broker_stop_while_paused_and_kill():
    with EmbeddedBroker() as broker:
        pid = broker.pid
        broker.pause()
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 5
    assert wait_exited(pid)

    broker.start()  # restartable
    pid = broker.pid
    broker.kill()
    assert not broker.running
    assert wait_exited(pid)


def test_auto_port_retries_when_taken(tmp_path, monkeypatch):
    """With port=None a port taken before start is replaced by a free one."""
    broker = EmbeddedBroker()
    taken = broker.port
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen()
        with broker:
            assert broker.port != taken
            create_topics(broker.bootstrap_servers, {"x": 1})
