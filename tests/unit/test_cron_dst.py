"""The cron DST policy (chronosDstPolicy) across real clock changes: Paris and New York (one hour)
and Lord Howe Island (30 minutes)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from chronos.domain import cron

UTC = timezone.utc


def occurrences(expr: str, zone: str, policy: str | None, start: datetime, n: int) -> list[str]:
    c = cron.parse(expr, zone, policy)
    out, t = [], start
    for _ in range(n):
        t = c.next_after(t)
        out.append(t.strftime("%m-%d %H:%M"))
    return out


# (expression, zone, from, {policy: expected UTC occurrences})
REPEATED = [
    # Paris, 25 Oct 2026: 03:00 CEST -> 02:00 CET; 02:30 is 00:30 UTC, then 01:30 UTC
    ("30 2 * * *", "Europe/Paris", datetime(2026, 10, 24, 12, 0, tzinfo=UTC),
     {None: ["10-25 00:30", "10-26 01:30"], "repeated=first": ["10-25 00:30", "10-26 01:30"],
      "repeated=last": ["10-25 01:30", "10-26 01:30"], "repeated=both": ["10-25 00:30", "10-25 01:30"]}),
    # every 20 minutes through the repeated hour: both passes interleave in UTC order
    ("*/20 2 * * *", "Europe/Paris", datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
     {"repeated=both": ["10-25 00:00", "10-25 00:20", "10-25 00:40", "10-25 01:00", "10-25 01:20",
                        "10-25 01:40", "10-26 01:00"],
      "repeated=last": ["10-25 01:00", "10-25 01:20", "10-25 01:40", "10-26 01:00"]}),
    # New York, 1 Nov 2026: 02:00 EDT -> 01:00 EST; 01:30 is 05:30 UTC, then 06:30 UTC
    ("30 1 * * *", "America/New_York", datetime(2026, 10, 31, 12, 0, tzinfo=UTC),
     {None: ["11-01 05:30", "11-02 06:30"], "repeated=last": ["11-01 06:30", "11-02 06:30"],
      "repeated=both": ["11-01 05:30", "11-01 06:30", "11-02 06:30"]}),
    # Lord Howe, 5 Apr 2026: 02:00 (+11:00) -> 01:30 (+10:30); 01:45 is 14:45 UTC, then 15:15 UTC
    ("45 1 * * *", "Australia/Lord_Howe", datetime(2026, 4, 4, 0, 0, tzinfo=UTC),
     {None: ["04-04 14:45", "04-05 15:15"], "repeated=last": ["04-04 15:15", "04-05 15:15"],
      "repeated=both": ["04-04 14:45", "04-04 15:15", "04-05 15:15"]}),
    # every minute across Lord Howe's change: `first` skips the repeated half hour, `both` fires it twice
    ("* * * * *", "Australia/Lord_Howe", datetime(2026, 4, 4, 14, 57, tzinfo=UTC),
     {None: ["04-04 14:58", "04-04 14:59", "04-04 15:30"],
      "repeated=both": ["04-04 14:58", "04-04 14:59", "04-04 15:00"],
      "repeated=last": ["04-04 15:00", "04-04 15:01"]}),
]

SKIPPED = [
    # Paris, 29 Mar 2026: 02:00 CET -> 03:00 CEST (01:00 UTC)
    ("30 2 * * *", "Europe/Paris", datetime(2026, 3, 28, 12, 0, tzinfo=UTC),
     {None: ["03-30 00:30"], "skipped=skip": ["03-30 00:30"], "skipped=next": ["03-29 01:00", "03-30 00:30"]}),
    # several skipped times fire once, at the end of the gap
    ("*/15 2 * * *", "Europe/Paris", datetime(2026, 3, 28, 23, 0, tzinfo=UTC),
     {None: ["03-30 00:00"], "skipped=next": ["03-29 01:00", "03-30 00:00"]}),
    # New York, 8 Mar 2026: 02:00 EST -> 03:00 EDT (07:00 UTC)
    ("30 2 * * *", "America/New_York", datetime(2026, 3, 7, 12, 0, tzinfo=UTC),
     {None: ["03-09 06:30"], "skipped=next": ["03-08 07:00", "03-09 06:30"]}),
    # Lord Howe, 4 Oct 2026: 02:00 (+10:30) -> 02:30 (+11:00), at 15:30 UTC on the 3rd
    ("15 2 * * *", "Australia/Lord_Howe", datetime(2026, 10, 3, 0, 0, tzinfo=UTC),
     {None: ["10-04 15:15"], "skipped=next": ["10-03 15:30", "10-04 15:15"]}),
    # a time that exists right after Lord Howe's gap is not doubled by `next`
    ("0,15,30 2 * * *", "Australia/Lord_Howe", datetime(2026, 10, 3, 0, 0, tzinfo=UTC),
     {"skipped=next": ["10-03 15:30", "10-04 15:00"], None: ["10-03 15:30", "10-04 15:00"]}),
]


@pytest.mark.parametrize("expr, zone, start, expected", REPEATED + SKIPPED)
def test_dst_policy_across_real_clock_changes(expr, zone, start, expected):
    for policy, want in expected.items():
        assert occurrences(expr, zone, policy, start, len(want)) == want, policy


def test_the_two_halves_of_a_policy_combine():
    start = datetime(2026, 3, 7, 12, 0, tzinfo=UTC)
    assert occurrences("30 2 * * *", "America/New_York", "skipped=next, repeated=both", start, 1) == ["03-08 07:00"]
    assert occurrences("30 1 * * *", "America/New_York", "repeated=both;skipped=next",
                       datetime(2026, 10, 31, 12, 0, tzinfo=UTC), 2) == ["11-01 05:30", "11-01 06:30"]


def test_latest_until_with_both_reports_the_second_pass():
    c = cron.parse("30 1 * * *", "America/New_York", "repeated=both")
    latest, nxt = c.latest_until(datetime(2026, 11, 1, 5, 0, tzinfo=UTC), datetime(2026, 11, 1, 7, 0, tzinfo=UTC))
    assert latest == datetime(2026, 11, 1, 6, 30, tzinfo=UTC) and nxt == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)


@pytest.mark.parametrize("bad", ["", " ", "first", "repeated", "repeated=sometimes", "skipped=first",
                                 "repeated=both,repeated=last", "folded=both", "repeated=both,,x=y"])
def test_a_bad_policy_is_a_cron_error(bad):
    with pytest.raises(cron.CronError, match="chronosDstPolicy"):
        cron.parse_policy(bad)


def test_policy_is_case_insensitive_and_defaults():
    assert cron.parse_policy(None) == cron.DstPolicy("first", "skip")
    assert cron.parse_policy("Repeated=BOTH") == cron.DstPolicy("both", "skip")


# -- intake: the header's value is checked when the message arrives ---------------------------------

def _decide(**kw):
    import re as _re

    from chronos import codec
    from chronos.domain.intake import Rules, decide
    base = dict(error=None, message_id="m", deadline_us=None, topic=None, ordering_key=None, action=None,
                cron="30 2 * * *", timezone="Europe/Paris", headers=[], dst_policy=None)
    base.update(kw)
    rules = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=_re.compile("out"))
    return decide(codec.Parsed(**base), 1_774_000_000_000_000, rules)  # 2026-03-20


def test_a_schedule_with_a_policy_starts_at_its_policys_first_occurrence():
    # 2026-03-28T12:00Z: the next 02:30 Paris is skipped on the 29th; `next` fires at the gap's end
    start = int(datetime(2026, 3, 28, 12, 0, tzinfo=UTC).timestamp() * 1_000_000)
    d = _decide(deadline_us=start, dst_policy="skipped=next")
    assert d.deadline_us == int(datetime(2026, 3, 29, 1, 0, tzinfo=UTC).timestamp() * 1_000_000)
    assert _decide(deadline_us=start).deadline_us == int(datetime(2026, 3, 30, 0, 30, tzinfo=UTC).timestamp() * 1e6)


@pytest.mark.parametrize("kw, detail", [
    (dict(dst_policy="repeated=sometimes"), "chronosDstPolicy"),
    (dict(dst_policy="folded"), "chronosDstPolicy"),
    (dict(dst_policy="repeated=both", cron=None, timezone=None, deadline_us=1_800_000_000_000_000),
     "chronosDstPolicy without chronosCron"),
])
def test_a_bad_policy_is_dead_lettered_as_bad_cron(kw, detail):
    from chronos.domain.intake import Verdict
    d = _decide(**kw)
    assert d.verdict is Verdict.INVALID and d.reason.startswith("bad_cron: ") and detail in d.reason


@pytest.mark.parametrize("impl", ["native", "python"])
def test_both_codecs_read_the_header_and_refuse_an_empty_one(impl):
    from chronos import codec
    mod = codec.implementation(impl)
    base = [("chronosMessageId", b"m"), ("chronosCron", b"@daily")]
    assert mod.parse_headers(base + [("chronosDstPolicy", b"repeated=last")]).dst_policy == "repeated=last"
    assert mod.parse_headers(base).dst_policy is None
    assert mod.parse_headers(base + [("chronosDstPolicy", b"")]).error == codec.types.ERR_BAD_DST_POLICY
    assert mod.parse_headers(base + [("chronosDstPolicy", b"a"), ("chronosDstPolicy", b"b")]).error \
        == "duplicate_header: chronosDstPolicy appears more than once"
    # not relayed: a chronos header
    assert mod.parse_headers(base + [("chronosDstPolicy", b"repeated=last")]).headers == []
