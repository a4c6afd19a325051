"""A claim that runs long stops nothing else: the firer's deletes go on meanwhile, and a SIGTERM
cancels the claim instead of waiting for it.

The claim is held by a real lock, not a hook in the code: a recurring schedule is due, and this
test holds an uncommitted row with the id of the occurrence the firer will create, so the
firer's claim waits on that row's unique index entry until the test lets go.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

# a backend of a chronos process waiting on a lock in the middle of a claim
BLOCKED_CLAIM = ("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'chronos firer %%' "
                 "AND wait_event_type = 'Lock' AND query LIKE '%%INSERT INTO chronos_messages%%'")


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond:06d}Z"


@pytest.fixture
def blocked_schedule(database_url) -> Iterator[psycopg.Connection]:
    """A due every-minute schedule whose next occurrence cannot be created while this holds."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        minute = admin.execute("SELECT date_trunc('minute', now())").fetchone()[0].astimezone(timezone.utc)
        admin.execute("INSERT INTO chronos_messages (id, deadline, cron, timezone) "
                      "VALUES ('every-minute', %s, '* * * * *', 'UTC')", (minute,))
    blocker = psycopg.connect(database_url)
    # this minute's occurrence, or a later one if the claim comes after the minute is over
    for i in range(3):
        blocker.execute("INSERT INTO chronos_messages (id, deadline) VALUES (%s, now() + interval '1 day')",
                        (f"every-minute@{_stamp(minute + timedelta(minutes=i))}",))
    yield blocker
    blocker.rollback()
    blocker.close()


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.05)


def _one(conn, sql: str) -> int:
    return conn.execute(sql).fetchone()[0]


def test_acknowledged_rows_are_deleted_while_a_claim_waits_on_a_lock(processes, database_url, blocked_schedule):
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("INSERT INTO chronos_messages (id, deadline, value) "
                      "SELECT 'due-' || g, now(), 'v'::bytea FROM generate_series(1, 50) AS g")
        firer = processes.start("firer", CHRONOS_LOOKAHEAD_MS="1000", CHRONOS_POLL_INTERVAL_MS="50")
        _wait(lambda: _one(admin, BLOCKED_CLAIM) == 1, 30, "the firer's claim is not blocked")
        # the claim that took these rows is still waiting: only a delete on another connection can
        # remove them
        _wait(lambda: _one(admin, "SELECT count(*) FROM chronos_messages WHERE id LIKE 'due-%%'") == 0, 20,
              "the published rows are not deleted while the claim waits")
        assert _one(admin, BLOCKED_CLAIM) == 1
        assert firer.poll() is None


def test_sigterm_cancels_a_claim_that_waits_on_a_lock(processes, database_url, blocked_schedule):
    with psycopg.connect(database_url, autocommit=True) as admin:
        firer = processes.start("firer", CHRONOS_POLL_INTERVAL_MS="50")
        _wait(lambda: _one(admin, BLOCKED_CLAIM) == 1, 30, "the firer's claim is not blocked")
        signalled = time.monotonic()
        firer.send_signal(signal.SIGTERM)
        assert firer.wait(10) == 0, processes.log_of(firer)
        assert time.monotonic() - signalled < 5, processes.log_of(firer)
        assert "stopping" in processes.log_of(firer)
        # the cancelled claim created nothing and left the schedule as it was
        assert _one(admin, BLOCKED_CLAIM) == 0
        assert _one(admin, "SELECT count(*) FROM chronos_messages WHERE readied_at IS NOT NULL") == 0
