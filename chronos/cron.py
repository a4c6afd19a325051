"""Five-field cron expressions, evaluated in an IANA time zone. Pure: `after` is passed in.

Fields: minute hour day-of-month month day-of-week, each `*`, a number, a range `a-b`, a step
`*/n` or `a-b/n`, or a comma list of those; months and weekdays also by name (`JAN`, `MON`);
day-of-week 0 or 7 is Sunday. As in Vixie cron, when both day fields are restricted a day
matches if either does. Nicknames `@yearly`, `@monthly`, `@weekly`, `@daily`, `@hourly`.

Local times that do not exist (the hour skipped when clocks go forward) are skipped;
ambiguous ones (the hour repeated when clocks go back) fire once, at the first of the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_NICKNAMES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
              "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_MONTHS = {m: i + 1 for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
_DAYS = {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())}
# (name, low, high, names)
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
           ("month", 1, 12, _MONTHS), ("day of week", 0, 7, _DAYS))
_SEARCH_YEARS = 5  # no occurrence within this many years means the expression never fires


class CronError(ValueError):
    """A bad cron expression or time zone; the message says what is wrong."""


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

    def next_after(self, after: datetime) -> datetime:
        """The first occurrence strictly after `after` (aware), in UTC."""
        local = after.astimezone(self.zone).replace(second=0, microsecond=0, tzinfo=None) + timedelta(minutes=1)
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
            aware = local.replace(tzinfo=self.zone, fold=0)
            utc = aware.astimezone(timezone.utc)
            # a wall time skipped by a DST change does not survive the round trip
            if utc.astimezone(self.zone).replace(tzinfo=None) == local and utc > after:
                return utc
            local += timedelta(minutes=1)
        raise CronError(f"{self.expression!r} has no occurrence within {_SEARCH_YEARS} years")

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


def parse(expression: str, tz: str | None = None) -> Cron:
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
                any_day=parts[2] == "*", any_weekday=parts[4] == "*")
    return cron


def first_occurrence(expression: str, tz: str | None, not_before_us: int | None, now_us: int) -> int:
    """Epoch µs of the first occurrence at or after max(now, not_before); raises CronError."""
    cron = parse(expression, tz)
    start_us = max(now_us, not_before_us or now_us)
    start = from_us(start_us - 1)  # exact: a float of epoch seconds drops microseconds past 2255
    return to_us(cron.next_after(start))


def to_us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)
