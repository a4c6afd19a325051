"""Recurring schedules: which occurrence a due schedule creates, and where it goes next. Pure: `now_us`
is passed in; both store adapters create the occurrence row and move the schedule as this says."""

from __future__ import annotations

from dataclasses import dataclass

from chronos import codec
from chronos.domain import cron


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence of a schedule, to create as a claimed row."""

    id: str              # `<schedule id>@<time>`: the same occurrence always has the same id
    deadline_us: int
    headers: bytes       # the schedule's, with chronosOccurrence added


@dataclass(frozen=True, slots=True)
class Step:
    """What one due schedule does now: create `occurrence` (None when the one due was already
    created), then wait for `next_us`."""

    next_us: int
    occurrence: Occurrence | None = None


def step(schedule_id: str, deadline_us: int, expression: str, timezone: str | None, dst_policy: str | None,
         headers: bytes | None, last_occurrence_us: int | None, now_us: int) -> Step:
    """The step of a schedule due at `deadline_us`; raises cron.CronError for a bad expression.

    A schedule replaced after its occurrence was created is due again at that same time: that
    occurrence (up to `last_occurrence_us`) is not created again, the schedule moves past it. Of
    the occurrences missed while nothing ran, only the latest fires."""
    schedule = cron.parse(expression, timezone, dst_policy)
    if last_occurrence_us is not None and deadline_us <= last_occurrence_us:
        return Step(cron.to_us(schedule.next_after(cron.from_us(last_occurrence_us))))
    horizon = max(now_us, deadline_us)
    latest, nxt = schedule.latest_until(cron.from_us(deadline_us), cron.from_us(horizon))
    occurrence_us = cron.to_us(latest) if latest is not None else deadline_us
    occurrence = cron.from_us(occurrence_us)
    stamp = occurrence.strftime("%Y-%m-%dT%H:%M:%S.") + f"{occurrence.microsecond:06d}Z"
    occurrence_headers = codec.encode_headers(codec.decode_headers(headers)
                                              + [("chronosOccurrence", stamp.encode())])
    return Step(cron.to_us(nxt), Occurrence(f"{schedule_id}@{stamp}", occurrence_us, occurrence_headers))
