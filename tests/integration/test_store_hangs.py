"""A PostgreSQL that hangs instead of dying, or turns read-only under a connection, against the real
store: every call has a deadline after which the connection is dropped; the next call connects again,
to the other server of a multi-host URL first; a read-only server is a lost connection, never a
refusal of the data."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chronos.adapters.postgres.store import Store
from chronos.domain.model import Row
from chronos.errors import StoreUnavailable
from chronos.telemetry.metrics import postgres_reached
from kits.proxy import FreezableProxy


def now_us() -> int:
    return time.time_ns() // 1000


def through(url: str, *addresses: str) -> str:
    """`url` with its host list replaced by `addresses` ("host:port", in order)."""
    return make_conninfo(url, host=",".join(a.split(":")[0] for a in addresses),
                         port=",".join(a.split(":")[1] for a in addresses))


def server_address(url: str) -> str:
    params = conninfo_to_dict(url)
    return f"{params['host']}:{params['port']}"


@pytest.fixture
def proxy(database_url):
    params = conninfo_to_dict(database_url)
    p = FreezableProxy((str(params["host"]), int(params["port"])))
    yield p
    p.close()


def test_a_statement_the_server_never_answers_is_given_up_at_the_deadline(database_url, proxy):
    st = Store(through(database_url, proxy.address), node_id=uuid.uuid4(), deadline_s=1.0)
    assert st.insert([Row("a", now_us() + 60_000_000, None, None, b"v", b"")]) == 1
    proxy.freeze()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=rf"PostgreSQL at {proxy.address} did not answer within 1s"):
        st.claim(10, 0)
    assert time.monotonic() - started < 3.0
    assert st.link.unanswered == 1 and st.link.server is None and st.conn is None
    assert postgres_reached(st) == 0.0  # what /healthz reads: not reached since the statement was given up
    assert st.last_unanswered > st.last_ok  # what a consumer's part of a poll queued behind the statement reads
    proxy.thaw()
    assert st.waiting_ids(["a"]) == {"a"}  # a new connection, same server
    assert st.link.connects == 2 and st.link.server_changes == 0 and st.last_ok > st.last_unanswered
    st.close()


def test_a_server_that_hangs_while_connecting_is_given_up_too(database_url, proxy):
    proxy.freeze()
    st = Store(through(database_url, proxy.address) + " connect_timeout=2", deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="cannot connect to PostgreSQL"):
        st.db_clock_us()
    assert time.monotonic() - started < 5.0
    assert st.last_unanswered > st.last_ok  # a connection that timed out counts as a statement that did


def test_after_a_hang_the_next_connection_tries_the_other_server_first(database_url, proxy):
    """A multi-host URL, the hung server first: once a statement is given up there, the store connects to
    the other one at once instead of waiting out a connect timeout on the hung one again."""
    real = server_address(database_url)
    st = Store(through(database_url, proxy.address, real), deadline_s=1.0)
    st.db_clock_us()
    assert st.link.server == proxy.address
    proxy.freeze()
    with pytest.raises(StoreUnavailable, match="did not answer"):
        st.db_clock_us()
    started = time.monotonic()
    st.db_clock_us()
    assert time.monotonic() - started < 1.0
    assert st.link.server == real and st.link.server_changes == 1
    st.close()


def test_a_server_that_turns_read_only_is_a_lost_connection_not_a_refused_row(database_url):
    """A primary demoted under a connection refuses writes with SQLSTATE 25006: the batch is not the
    problem (the consumer would dead-letter it row by row), the connection is; the next call opens
    another one, which libpq's target_session_attrs=read-write keeps off read-only servers."""
    st = Store(database_url, node_id=uuid.uuid4())
    assert st.insert([Row("a", now_us(), None, None, b"v", b"")]) == 1
    assert st.conn is not None
    st.conn.execute("SET default_transaction_read_only = on")  # as a demoted primary's sessions find it
    with pytest.raises(StoreUnavailable, match="is read-only"):
        st.insert([Row("b", now_us(), None, None, b"v", b"")])
    assert st.link.read_only == 1 and st.conn is None
    assert st.insert([Row("b", now_us(), None, None, b"v", b"")]) == 1
    st.close()


def test_a_read_only_server_is_passed_over_at_connect(database_url, pg_server):
    name = conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    st = Store(database_url)
    with pytest.raises(StoreUnavailable, match="read-only"):
        st.db_clock_us()
    assert st.conn is None
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} RESET default_transaction_read_only")
    st.db_clock_us()
    st.close()


def test_connections_carry_keepalives_and_a_tcp_user_timeout_unless_the_url_sets_them(database_url):
    st = Store(database_url)
    st.db_clock_us()
    assert st.conn is not None
    params = st.conn.info.get_parameters()
    assert params["keepalives_idle"] == "5" and params["tcp_user_timeout"] == "10000", params
    assert params["target_session_attrs"] == "read-write"
    st.close()
    st = Store(database_url + "?keepalives_idle=30" if "?" not in database_url else database_url + "&keepalives_idle=30")
    st.db_clock_us()
    assert st.conn is not None and st.conn.info.get_parameters()["keepalives_idle"] == "30"
    st.close()


def test_a_multi_host_url_that_reaches_no_server_says_what_each_host_answered_without_the_password():
    st = Store("postgresql://app:Hidden-S3cret@127.0.0.1:1,127.0.0.1:2/chronos?connect_timeout=2")
    with pytest.raises(StoreUnavailable) as caught:
        st.db_clock_us()
    text = str(caught.value)
    assert "port: '1'" in text and "port: '2'" in text, text
    assert "Hidden-S3cret" not in text and "app:***@127.0.0.1:1,127.0.0.1:2" in text, text
