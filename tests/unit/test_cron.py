"""Cron expressions: parsing, next occurrence (with time zones and DST), missed occurrences."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from chronos.domain import cron

UTC = timezone.utc


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize("expr,after,expected", [
    ("* * * * *", at(2026, 1, 1, 0, 0, 30), at(2026, 1, 1, 0, 1)),
    ("*/15 * * * *", at(2026, 1, 1, 0, 1), at(2026, 1, 1, 0, 15)),
    ("0 9 * * MON-FRI", at(2026, 11, 21, 10, 0), at(2026, 11, 23, 9, 0)),   # Saturday -> Monday
    ("30 2 1 * *", at(2026, 1, 31), at(2026, 2, 1, 2, 30)),
    ("0 0 29 2 *", at(2026, 3, 1), at(2028, 2, 29)),                       # leap day
    ("0 12 13 * FRI", at(2026, 11, 1), at(2026, 11, 6, 12)),               # dom OR dow when both set
    ("@hourly", at(2026, 1, 1, 5, 0), at(2026, 1, 1, 6, 0)),
    ("0 0 * * 7", at(2026, 11, 21), at(2026, 11, 22)),                     # 7 is Sunday
    ("5,10-12 1 * JAN,DEC *", at(2026, 6, 1), at(2026, 12, 1, 1, 5)),
])
def test_next_after(expr, after, expected):
    assert cron.parse(expr).next_after(after) == expected


def test_time_zone_and_dst():
    c = cron.parse("30 2 * * *", "Europe/Berlin")
    # 2026-03-29 02:30 does not exist in Berlin (clocks go 02:00 -> 03:00): skipped
    assert c.next_after(at(2026, 3, 28, 2, 0)) == at(2026, 3, 30, 0, 30)
    # 2026-10-25 02:30 happens twice: fires once, at the first (CEST, UTC+2)
    assert c.next_after(at(2026, 10, 24, 2, 0)) == at(2026, 10, 25, 0, 30)
    assert c.next_after(at(2026, 10, 25, 0, 30)) == at(2026, 10, 26, 1, 30)
    assert cron.parse("0 9 * * *", "America/New_York").next_after(at(2026, 7, 1)) == at(2026, 7, 1, 13)


@pytest.mark.parametrize("expr,tz,message", [
    ("* * * *", None, "five fields"),
    ("60 * * * *", None, "minute value '60'"),
    ("* * * FOO *", None, "month value"),
    ("*/0 * * * *", None, "step"),
    ("5-1 * * * *", None, "backwards"),
    ("* * * * *", "Mars/Olympus", "unknown time zone"),
])
def test_bad_expressions(expr, tz, message):
    with pytest.raises(cron.CronError, match=message):
        cron.parse(expr, tz)


def test_never_firing_expression_is_an_error():
    with pytest.raises(cron.CronError, match="no occurrence"):
        cron.parse("0 0 30 2 *").next_after(at(2026, 1, 1))


def test_latest_missed_occurrence_fires_once():
    c = cron.parse("*/10 * * * *")
    latest, nxt = c.latest_until(at(2026, 1, 1, 0, 0), at(2026, 1, 1, 1, 5))
    assert (latest, nxt) == (at(2026, 1, 1, 1, 0), at(2026, 1, 1, 1, 10))
    latest, nxt = c.latest_until(at(2026, 1, 1, 0, 0), at(2026, 3, 1, 0, 3))  # months down
    assert (latest, nxt) == (at(2026, 3, 1, 0, 0), at(2026, 3, 1, 0, 10))
    yearly = cron.parse("0 0 1 1 *")
    assert yearly.latest_until(at(2026, 1, 1), at(2027, 6, 1)) == (at(2027, 1, 1), at(2028, 1, 1))
    assert c.latest_until(at(2026, 1, 1, 0, 10), at(2026, 1, 1, 0, 5)) == (None, at(2026, 1, 1, 0, 10))


def test_first_occurrence_respects_not_before():
    now = cron.to_us(at(2026, 1, 1, 0, 0, 30))
    assert cron.from_us(cron.first_occurrence("0 * * * *", None, None, now)) == at(2026, 1, 1, 1)
    nb = cron.to_us(at(2026, 5, 1, 12))
    assert cron.from_us(cron.first_occurrence("0 * * * *", None, nb, now)) == at(2026, 5, 1, 12)
