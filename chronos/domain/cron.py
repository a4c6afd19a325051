"""Five-field cron expressions, evaluated in an IANA time zone. Pure: `after` is passed in.

Fields: minute hour day-of-month month day-of-week, each `*`, a number, a range `a-b`, a step
`*/n` or `a-b/n`, or a comma list of those; months and weekdays also by name (`JAN`, `MON`);
day-of-week 0 or 7 is Sunday. As in Vixie cron, when both day fields are restricted a day
matches if either does. Nicknames `@yearly`, `@monthly`, `@weekly`, `@daily`, `@hourly`.

Daylight saving time: a schedule's `DstPolicy` (the `chronosDstPolicy` header) says what a local
time repeated when clocks go back does (`repeated=first`, the default: fire at the first of the two
instants; `last`: at the second; `both`: at each) and what a local time skipped when clocks go
forward does (`skipped=skip`, the default: no occurrence; `next`: fire at the first valid instant
after the gap, once however many skipped times matched).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_NICKNAMES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
              "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_MONTHS = {m: i + 1 for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
_DAYS = {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())}
# (name, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS), ("day of week", 0, 7, _DAYS))
_SEARCH_YEARS = 5  # no occurrence within this many years means the expression never fires


class CronError(ValueError):
    """A bad cron expression or time zone; the message says what is wrong."""


@dataclass(frozen=True)
class DstPolicy:
    repeated: str = "first"     # first, last, both
    skipped: str = "skip"       # skip, next


_POLICY_VALUES = {"repeated": ("first", "last", "both"), "skipped": ("skip", "next")}
# Clocks never move by more than this at once; near a change the search looks this far around.
_MAX_SHIFT = timedelta(hours=3)


def parse_policy(text: str | None) -> DstPolicy:
    """`repeated=first|last|both` and/or `skipped=skip|next`, separated by commas; None: the default."""
    if text is None:
        return DstPolicy()
    values: dict[str, str] = {}
    parts = [p for p in re.split(r"[,;\s]+", text.strip()) if p]
    if not parts:
        raise CronError("chronosDstPolicy is empty: give repeated=first|last|both and/or skipped=skip|next")
    for part in parts:
        name, sep, value = (x.strip().lower() for x in part.partition("="))
        if not sep or name not in _POLICY_VALUES or name in values:
            raise CronError(f"chronosDstPolicy {text!r}: expected repeated=first|last|both and/or "
                            f"skipped=skip|next, each once")
        if value not in _POLICY_VALUES[name]:
            raise CronError(f"chronosDstPolicy {name}={value!r}: use one of {', '.join(_POLICY_VALUES[name])}")
        values[name] = value
    return DstPolicy(**values)


def _value(text: str, low: int, high: int, names: dict[str, int], field: str) -> int:
    value = names.get(text.upper()) if not text.isdigit() else int(text)
    if value is None or not low <= value <= high:
        raise CronError(f"{field} value {text!r} is not in {low}-{high}")
    return value


def _field(text: str, low: int, high: int, names: dict[str, int], field: str) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        rng, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field} step {step_text!r} is not a positive number")
            step = int(step_text)
        if rng == "*":
            start, end = low, high
        elif "-" in rng:
            a, b = rng.split("-", 1)
            start, end = _value(a, low, high, names, field), _value(b, low, high, names, field)
            if start > end:
                raise CronError(f"{field} range {rng!r} runs backwards")
        else:
            start = _value(rng, low, high, names, field)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    expression: str
    zone: ZoneInfo
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool
    any_weekday: bool
    policy: DstPolicy = field(default_factory=DstPolicy)

    def _day_matches(self, d: datetime) -> bool:
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return dow
        if self.any_weekday:
            return dom
        return dom or dow

    def _local_matches(self, local: datetime) -> Iterator[datetime]:
        """Matching local wall times (naive, whole minutes) from `local` on, in order."""
        limit = local.year + _SEARCH_YEARS
        while local.year <= limit:
            if local.month not in self.months:
                year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
                local = local.replace(year=year, month=month, day=1, hour=0, minute=0)
                continue
            if not self._day_matches(local):
                local = (local + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if local.hour not in self.hours:
                local = (local + timedelta(hours=1)).replace(minute=0)
                continue
            if local.minute not in self.minutes:
                local += timedelta(minutes=1)
                continue
            yield local
            local += timedelta(minutes=1)

    def _instants(self, local: datetime) -> list[datetime]:
        """The UTC instants a local wall time fires at under the DST policy (none, one or two)."""
        first = local.replace(tzinfo=self.zone, fold=0).astimezone(timezone.utc)
        second = local.replace(tzinfo=self.zone, fold=1).astimezone(timezone.utc)
        if first == second:
            return [first]
        if first.astimezone(self.zone).replace(tzinfo=None) == local:   # repeated: both instants exist
            return {"first": [first], "last": [second], "both": [first, second]}[self.policy.repeated]
        if self.policy.skipped == "skip":                                # skipped by the clocks
            return []
        # fold=1 reads the time with the offset after the change, which puts it before the change:
        # walk forward to the instant the offset changes, the first valid one after the gap
        t, end = min(first, second), max(first, second)
        offset = t.astimezone(self.zone).utcoffset()
        while t < end and t.astimezone(self.zone).utcoffset() == offset:
            t += timedelta(minutes=1)
        return [t]

    def _near_change(self, t: datetime) -> bool:
        return (t - _MAX_SHIFT).astimezone(self.zone).utcoffset() != (t + _MAX_SHIFT).astimezone(self.zone).utcoffset()

    def next_after(self, after: datetime) -> datetime:
        """The first occurrence strictly after `after` (aware), in UTC.

        Local wall times are walked in order; near a clock change a later wall time can be an earlier
        instant (the repeated hour), so there the walk starts before `after` and looks a little past
        its first find."""
        local = after.astimezone(self.zone).replace(second=0, microsecond=0, tzinfo=None) + timedelta(minutes=1)
        if self._near_change(after):
            local -= _MAX_SHIFT
        best: datetime | None = None
        horizon: datetime | None = None
        for wall in self._local_matches(local):
            if horizon is not None and wall > horizon:
                break
            for t in self._instants(wall):
                if t > after and (best is None or t < best):
                    best = t
            if best is not None and horizon is None:
                if not self._near_change(best):
                    return best
                horizon = wall + _MAX_SHIFT
        if best is None:
            raise CronError(f"{self.expression!r} has no occurrence within {_SEARCH_YEARS} years")
        return best

    def latest_until(self, start: datetime, now: datetime) -> tuple[datetime | None, datetime]:
        """(the latest occurrence in [start, now], or None; the first occurrence after now).

        Used on recovery: of the occurrences missed while nothing ran, only the latest fires.
        """
        latest = None
        t = start - timedelta(microseconds=1)
        # far behind: skip ahead instead of walking every missed occurrence
        if now - start > timedelta(days=1):
            t = max(t, now - timedelta(days=1))
            try:
                probe = self.next_after(t)
            except CronError:
                probe = None
            if probe is None or probe > now:
                t = start - timedelta(microseconds=1)
        while True:
            occurrence = self.next_after(t)
            if occurrence > now:
                return latest, occurrence
            latest, t = occurrence, occurrence


def parse(expression: str, tz: str | None = None, dst_policy: str | None = None) -> Cron:
    try:
        zone = ZoneInfo(tz or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {tz!r}") from None
    text = _NICKNAMES.get(expression.strip().lower(), expression)
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"{expression!r} must have five fields (minute hour day month weekday)")
    sets = [_field(p, lo, hi, names, name) for p, (name, lo, hi, names) in zip(parts, _FIELDS)]
    weekdays = frozenset(d % 7 for d in sets[4])
    cron = Cron(expression, zone, sets[0], sets[1], sets[2], sets[3], weekdays,
                any_day=parts[2] == "*", any_weekday=parts[4] == "*", policy=parse_policy(dst_policy))
    return cron


def first_occurrence(expression: str, tz: str | None, not_before_us: int | None, now_us: int,
                     dst_policy: str | None = None) -> int:
    """Epoch µs of the first occurrence at or after max(now, not_before); raises CronError."""
    cron = parse(expression, tz, dst_policy)
    start_us = max(now_us, not_before_us or now_us)
    start = from_us(start_us - 1)  # exact: a float of epoch seconds drops microseconds past 2255
    return to_us(cron.next_after(start))


def to_us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)
