"""Which occurrence a due recurring schedule creates, and where it goes next (chronos.domain.schedules)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from chronos import codec
from chronos.domain import cron, schedules


def us(text: str) -> int:
    return cron.to_us(datetime.fromisoformat(text).replace(tzinfo=timezone.utc))


def test_a_due_schedule_creates_its_occurrence_with_its_headers_and_an_id_of_its_time():
    headers = codec.encode_headers([("h", b"1")])
    step = schedules.step("tick", us("2026-01-01T10:00:00"), "*/5 * * * *", None, None, headers, None,
                          us("2026-01-01T10:00:30"))
    assert step.next_us == us("2026-01-01T10:05:00")
    assert step.occurrence == schedules.Occurrence(
        "tick@2026-01-01T10:00:00.000000Z", us("2026-01-01T10:00:00"),
        codec.encode_headers([("h", b"1"), ("chronosOccurrence", b"2026-01-01T10:00:00.000000Z")]))


def test_of_the_occurrences_missed_only_the_latest_fires():
    step = schedules.step("s", us("2026-01-01T07:00:00"), "*/10 * * * *", None, None, b"", None,
                          us("2026-01-01T10:07:00"))
    assert step.occurrence is not None and step.occurrence.deadline_us == us("2026-01-01T10:00:00")
    assert step.next_us == us("2026-01-01T10:10:00")


def test_an_occurrence_already_created_is_not_created_again():
    """A schedule replaced after its occurrence was created is due at that time again: it moves on."""
    step = schedules.step("s", us("2026-01-01T10:00:00"), "*/5 * * * *", None, None, b"",
                          us("2026-01-01T10:00:00"), us("2026-01-01T09:58:00"))
    assert step == schedules.Step(us("2026-01-01T10:05:00"))


def test_a_due_time_in_the_future_is_the_occurrence():
    """Claimed within the lookahead, before its time: the occurrence is the schedule's deadline."""
    step = schedules.step("s", us("2026-01-01T10:00:00"), "0 * * * *", "Europe/Paris", None, b"", None,
                          us("2026-01-01T09:59:00"))
    assert step.occurrence is not None and step.occurrence.deadline_us == us("2026-01-01T10:00:00")
    assert step.next_us == us("2026-01-01T11:00:00")


def test_a_bad_expression_is_an_error_for_the_store_to_act_on():
    with pytest.raises(cron.CronError):
        schedules.step("s", 0, "61 * * * *", None, None, b"", None, 0)
