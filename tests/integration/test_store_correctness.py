"""Exact deadlines at the edges of the calendar, a replace racing a recurring occurrence, a
cancel of a row already in flight, and driver errors without passwords: the store against a real
PostgreSQL (or a closed port), with a chosen `now`."""

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
from chronos.adapters.postgres.store import Store, connect, migrate


def us(text: str) -> int:
    """Epoch microseconds of an ISO-8601 UTC time, exactly (no float on the way)."""
    return cron.to_us(datetime.fromisoformat(text.replace("Z", "+00:00")))


def store(url) -> Store:
    return Store(url, node_id=uuid.uuid4())


def row(mid: str, deadline_us: int, value: bytes = b"v", **kw) -> Row:
    return Row(mid, deadline_us, None, b"k", value, b"", None, kw.get("cron"), kw.get("timezone"))


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



# -- a replace racing a recurring occurrence ------------------------------------------------------

LOOKAHEAD_MS = 300_000  # covers the schedule's next occurrence (at most ~3 minutes away), not the one after


def hourly_soon(now: int) -> tuple[str, int]:
    """An hourly expression whose next occurrence is 2-3 minutes after `now` (the one after is an
    hour later, outside the lookahead), and that occurrence."""
    minute = (cron.from_us(now).minute + 3) % 60
    expr = f"{minute} * * * *"
    return expr, cron.first_occurrence(expr, None, None, now)


def test_a_replace_after_the_occurrence_was_created_does_not_create_it_again(database_url):
    """The firer created occurrence `id@T` within its lookahead and published it; then a replace
    arrives before T: the replacement's first occurrence from now is T again. It must not be
    created a second time (with the new value); the replacement applies from the next one."""
    s = store(database_url)
    now = time.time_ns() // 1000
    expr, due = hourly_soon(now)
    s.insert([row("report", due, b"old", cron=expr)])
    first = s.claim_schedules(10, LOOKAHEAD_MS, now)
    assert [(c.id, c.value, c.deadline_us) for c in first] == [(f"report@{cron.from_us(due):%Y-%m-%dT%H:%M}:00.000000Z",
                                                                b"old", due)]
    s.delete_fired(first)  # published and acknowledged before the replace is stored
    replace_at = now + 1000
    s.apply([], [row("report", cron.first_occurrence(expr, None, None, replace_at), b"new", cron=expr)], [])
    assert s.claim_schedules(10, LOOKAHEAD_MS, replace_at) == []
    [(sid, _, _, next_us, *_)] = s.list_schedules()
    assert (sid, next_us) == ("report", due + 3_600_000_000)
    # the replacement fires from the next occurrence on
    [occ] = s.claim_schedules(10, 2 * 3_600_000, replace_at)
    assert (occ.value, occ.deadline_us) == (b"new", due + 3_600_000_000)

def test_a_replace_before_the_occurrence_is_created_applies_to_it(database_url):
    s = store(database_url)
    now = time.time_ns() // 1000
    expr, due = hourly_soon(now)
    s.insert([row("report", due, b"old", cron=expr)])
    s.apply([], [row("report", due, b"new", cron=expr)], [])
    [occ] = s.claim_schedules(10, LOOKAHEAD_MS, now)
    assert (occ.value, occ.deadline_us) == (b"new", due)


def test_a_replace_with_another_expression_skips_only_the_occurrences_already_created(database_url):
    """The new expression's occurrences after the created one fire, even before the old next one."""
    s = store(database_url)
    now = time.time_ns() // 1000
    expr, due = hourly_soon(now)
    s.insert([row("report", due, b"old", cron=expr)])
    [occ] = s.claim_schedules(10, LOOKAHEAD_MS, now)
    s.delete_fired([occ])
    every_minute = "* * * * *"
    s.apply([], [row("report", cron.first_occurrence(every_minute, None, None, now), b"new",
                     cron=every_minute)], [])
    assert s.claim_schedules(10, LOOKAHEAD_MS, now) == []  # skips to the first minute after `due`
    [occ] = s.claim_schedules(10, LOOKAHEAD_MS, now)
    assert (occ.value, occ.deadline_us) == (b"new", due + 60_000_000)


# -- a cancel of a row already in flight ----------------------------------------------------------

def test_a_cancel_of_a_claimed_row_is_counted_apart_and_still_deletes_it(database_url):
    """A firer claimed `held` within its lookahead: the cancel deletes it (a detector reset cannot
    bring it back) but says it found it in flight, since that firer may still publish it."""
    s = store(database_url)
    now = time.time_ns() // 1000
    s.insert([row("held", now + 100_000), row("waiting", now + 60_000_000)])
    [held] = s.claim(10, 300)
    assert held.id == "held"
    assert s.apply([], [], ["held", "waiting", "unknown"]) == (0, 0, 1, 1)
    assert s.find_stale(-60_000) == []  # nothing left for a detector to hand back
    assert s.delete_fired([held]) == 0


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
