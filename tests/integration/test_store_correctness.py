"""Exact deadlines at the edges of the calendar and driver errors without passwords: the store
against a real PostgreSQL (or a closed port). (A replace racing a recurring occurrence and a cancel
of a row in flight are in the contract suite, tests/contract.)"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chronos.domain import cron
from chronos.errors import StoreRejected, StoreUnavailable
from chronos.domain.model import Row
from chronos.adapters.postgres.connection import connect
from chronos.adapters.postgres.migrations import migrate
from chronos.adapters.postgres.store import Store


def us(text: str) -> int:
    """Epoch microseconds of an ISO-8601 UTC time, exactly (no float on the way)."""
    return cron.to_us(datetime.fromisoformat(text.replace("Z", "+00:00")))


def store(url) -> Store:
    return Store(url, node_id=uuid.uuid4())


def row(mid: str, deadline_us: int, value: bytes = b"v", **kw) -> Row:
    return Row(mid, deadline_us, None, b"k", value, b"", None, cron=kw.get("cron"), timezone=kw.get("timezone"))


# -- exact deadlines -----------------------------------------------------------------------------

EDGES = {
    "last-microsecond": us("9999-12-31T23:59:59.999999Z"),
    "2300-odd-micros": us("2300-06-15T12:34:56.987653Z"),
    "epoch": 0,
    "epoch-plus-1": 1,
    "epoch-minus-1": -1,
    "1969": us("1969-07-20T20:17:40.000001Z"),
    "1900": us("1900-02-28T23:59:59.999999Z"),
    "year-1": us("0001-01-01T00:00:00.000001Z"),
}


@pytest.mark.parametrize("replace", [False, True], ids=["insert", "replace"])
def test_deadlines_round_trip_to_the_microsecond(database_url, replace):
    s = store(database_url)
    rows = [row(name, deadline) for name, deadline in EDGES.items()]
    s.apply([] if replace else rows, rows if replace else [], [])
    with s._c().cursor() as cur:
        stored = dict(cur.execute("SELECT id, deadline FROM chronos_messages").fetchall())
    assert {name: cron.to_us(when) for name, when in stored.items()} == EDGES
    # and back again through the claim's epoch arithmetic: every row, far future included
    far = (EDGES["last-microsecond"] - time.time_ns() // 1000) // 1000 + 1000
    claimed = s.claim(100, far)
    assert {c.id: c.deadline_us for c in claimed} == EDGES


def test_status_works_with_far_future_deadlines(database_url):
    s = store(database_url)
    s.insert([row("end-of-time", EDGES["last-microsecond"]), row("2300", EDGES["2300-odd-micros"]),
              row("1969", EDGES["1969"])])
    view = s.overview(5000, exact=True)
    assert view.waiting == 3 and view.due == 1
    assert cron.to_us(view.next_deadline) == EDGES["2300-odd-micros"]
    s.delete_fired(s.claim(10, 0))  # the 1969 row
    far = s.claim(10, (EDGES["last-microsecond"] - time.time_ns() // 1000) // 1000 + 1000)
    assert [c.deadline_us for c in far] == [EDGES["2300-odd-micros"], EDGES["last-microsecond"]]
    view = s.overview(5000, exact=True)
    assert view.in_flight == 2 and cron.to_us(view.by_node[0].oldest_deadline) == EDGES["2300-odd-micros"]


# -- driver errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["postgresql://app:pw/x@127.0.0.1:1/db", "postgresql://app:s3@cret@127.0.0.1:1/db",
                                 "postgresql://app:s3cret and spaces@127.0.0.1:1/db",
                                 "postgresql://app@127.0.0.1:1/db?password=s3cret&port=notaport",
                                 "postgresql://app@127.0.0.1:1/db?password=s3cret"])
def test_driver_errors_never_carry_the_password(url):
    """libpq's own messages quote pieces of a bad URL: a password with spaces, the host it read
    from the rest of a password with an unescaped `@`."""
    with pytest.raises(StoreUnavailable) as caught:
        connect(url, connect_timeout=1)
    text = str(caught.value)
    for secret in ("pw", "s3cret", "cret"):
        assert secret not in text, text


def test_a_migration_postgres_refuses_is_one_line_without_the_password(database_url):
    """A role without the right to create tables: `chronos migrate` says so in one line."""
    role = f"nopriv_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'Mig-S3cret'")
    params = conninfo_to_dict(database_url)
    url = make_conninfo(database_url, user=role, password="Mig-S3cret")
    assert params.get("password") is None  # the fixture's URL carries none; this one does
    with pytest.raises(StoreRejected) as caught:
        migrate(url)
    assert str(caught.value).startswith("migration failed: permission denied"), caught.value
    assert "Mig-S3cret" not in str(caught.value)
