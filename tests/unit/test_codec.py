"""Example-based tests of the header codec, run against both implementations."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import chronos.codec as codec
from chronos.codec import (
    HEADER_ACTION,
    HEADER_CRON,
    HEADER_DEADLINE,
    HEADER_ID,
    HEADER_ORDERING_KEY,
    HEADER_TIMEZONE,
    HEADER_TOPIC,
    MAX_DEADLINE_MS,
    REASON_CODES,
    Parsed,
    implementation,
)

ROOT = Path(__file__).resolve().parents[2]
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
UTC = timezone.utc


@pytest.fixture(params=["python", "native"])
def impl(request):
    return implementation(request.param)


def us(dt: datetime) -> int:
    """Independent expectation: epoch microseconds computed by datetime."""
    return (dt - EPOCH) // timedelta(microseconds=1)


def tz(hours: int, minutes: int = 0) -> timezone:
    sign = -1 if hours < 0 else 1
    return timezone(sign * timedelta(hours=abs(hours), minutes=minutes))


def code(parsed: Parsed) -> str | None:
    return None if parsed.error is None else parsed.error.split(":", 1)[0]


def valid(**overrides) -> list[tuple[str, bytes | None]]:
    base = {HEADER_ID: b"msg-1", HEADER_DEADLINE: b"1700000000000"}
    base.update(overrides)
    return [(k, v) for k, v in base.items()]


# ---------------------------------------------------------------------------
# deadlines
# ---------------------------------------------------------------------------

VALID_DEADLINES = [
    # epoch milliseconds
    (b"0", 0),
    (b"1", 1000),
    (b"1748781296789", 1748781296789000),
    (b"000000000000001", 1000),  # 15 digits with leading zeros
    (b"253402300799999", MAX_DEADLINE_MS * 1000),
    (b"2024", 2024000),  # 4 digits is epoch ms, not a year
    # ISO-8601
    (b"2025-06-01T12:34:56Z", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=UTC))),
    (b"2025-06-01T12:34:56z", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=UTC))),
    (b"2025-06-01t12:34:56Z", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=UTC))),
    (b"2025-06-01 12:34:56", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=UTC))),
    (b"2025-06-01T12:34:56", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=UTC))),
    (b"2025-06-01T12:34", us(datetime(2025, 6, 1, 12, 34, tzinfo=UTC))),
    (b"2025-06-01T12:34Z", us(datetime(2025, 6, 1, 12, 34, tzinfo=UTC))),
    (b"2025-06-01T12:34+02:00", us(datetime(2025, 6, 1, 12, 34, tzinfo=tz(2)))),
    (b"2025-06-01T12:34:56.789123Z", us(datetime(2025, 6, 1, 12, 34, 56, 789123, tzinfo=UTC))),
    (b"2025-06-01T12:34:56.7Z", us(datetime(2025, 6, 1, 12, 34, 56, 700000, tzinfo=UTC))),
    (b"2025-06-01T12:34:56,5", us(datetime(2025, 6, 1, 12, 34, 56, 500000, tzinfo=UTC))),
    (b"2025-06-01T12:34:56.000001Z", us(datetime(2025, 6, 1, 12, 34, 56, 1, tzinfo=UTC))),
    (b"2025-06-01T12:34:56.123456789Z", us(datetime(2025, 6, 1, 12, 34, 56, 123456, tzinfo=UTC))),
    (b"2025-06-01T12:34:56.9999999-00:00", us(datetime(2025, 6, 1, 12, 34, 56, 999999, tzinfo=UTC))),
    (b"2025-06-01T12:34:56+05:30", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=tz(5, 30)))),
    (b"2025-06-01T12:34:56+0530", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=tz(5, 30)))),
    (b"2025-06-01T12:34:56+05", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=tz(5)))),
    (b"2025-06-01T12:34:56-08:00", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=tz(-8)))),
    (b"2025-06-01T12:34:56-0945", us(datetime(2025, 6, 1, 12, 34, 56, tzinfo=tz(-9, 45)))),
    (b"2025-06-01T12:34:56.25+23:59", us(datetime(2025, 6, 1, 12, 34, 56, 250000, tzinfo=tz(23, 59)))),
    (b"2025-06-01T00:00:00-23:59", us(datetime(2025, 6, 1, tzinfo=tz(-23, 59)))),
    (b"2024-02-29T00:00:00Z", us(datetime(2024, 2, 29, tzinfo=UTC))),  # leap day
    (b"2000-02-29T23:59:59Z", us(datetime(2000, 2, 29, 23, 59, 59, tzinfo=UTC))),  # 400 rule
    (b"2025-12-31T23:59:59Z", us(datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC))),
    (b"1970-01-01T00:00:00Z", 0),
    (b"1969-12-31T23:59:59.999999Z", -1),  # before 1970 is allowed
    (b"1900-01-01T00:00:00Z", us(datetime(1900, 1, 1, tzinfo=UTC))),
    (b"0001-01-01T00:00:00Z", us(datetime(1, 1, 1, tzinfo=UTC))),
    (b"0001-01-01T00:00:00-01:00", us(datetime(1, 1, 1, 1, tzinfo=UTC))),
    (b"9999-12-31T23:59:59.999999Z", us(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))),
    (b"9999-12-31T23:59:59+01:00", us(datetime(9999, 12, 31, 22, 59, 59, tzinfo=UTC))),
]

INVALID_DEADLINES = [
    b"",
    b"1748781296789.5",  # float epoch
    b"1748781296789.",
    b"1.7e12",
    b"1e3",
    b"253402300800000",  # MAX_DEADLINE_MS + 1
    b"999999999999999",  # 15 digits but out of range
    b"1234567890123456",  # 16 digits
    b"0000000000000001",  # 16 digits even if small
    b"-1",
    b"-1748781296789",
    b"+5",
    b"+1748781296789",
    b"1_000",
    b"0x10",
    b" 1748781296789",
    b"1748781296789 ",
    b"1748781296789\n",
    "１２３".encode(),  # full-width digits
    "٣".encode(),  # Arabic-Indic digit
    b"2025-06-01T12:34:56Z ",
    b" 2025-06-01T12:34:56Z",
    b"2025-06-01T12:34:56Z\n",
    b"2025-13-01T00:00:00Z",  # month 13
    b"2025-00-01T00:00:00Z",
    b"2025-02-30T00:00:00Z",  # Feb 30
    b"2023-02-29T00:00:00Z",  # not a leap year
    b"1900-02-29T00:00:00Z",  # century, not leap
    b"2025-04-31T00:00:00Z",
    b"2025-06-00T00:00:00Z",
    b"2025-06-01T24:00:00Z",  # 24:00
    b"2025-06-01T12:60:00Z",
    b"2025-06-01T12:34:60Z",  # leap second
    b"2025-06-01T12:34:56+25:00",  # offset hour > 23
    b"2025-06-01T12:34:56+24:00",
    b"2025-06-01T12:34:56+05:60",  # offset minute > 59
    b"2025-06-01T12:34:56+5:00",
    b"2025-06-01T12:34:56+05:3",
    b"2025-06-01T12:34:56+053",
    b"2025-06-01T12:34:56+05:",
    b"2025-06-01T12:34:56+",
    b"2025-06-01T12:34:56+05:30:00",
    b"2025-06-01T12:34:56+05:30Z",
    b"2025-06-01T12:34:56 +05:00",
    b"2025-06-01T12:34:56ZZ",
    b"2025-06-01T12:34:56UTC",
    b"2025-06-01T12:34:56GMT",
    b"0000-01-01T00:00:00Z",  # year 0
    b"10000-01-01T00:00:00Z",
    b"0001-01-01T00:00:00+00:01",  # before 0001-01-01 UTC
    b"9999-12-31T23:59:59-00:01",  # after 9999-12-31 UTC
    b"2025-06-01",  # date only
    b"2025-06-01T",
    b"2025-06-01T12",
    b"2025-06-01T12Z",
    b"2025-06-01T12:34:5",
    b"2025-06-01T1:34:56Z",
    b"2025-6-01T12:34:56Z",
    b"25-06-01T12:34:56Z",
    b"20250601T123456Z",  # basic format
    b"2025-06-01T123456Z",
    b"2025-06-01T12:34.5Z",  # fraction without seconds
    b"2025-06-01T12:34:56.Z",  # empty fraction
    b"2025-06-01T12:34:56.",
    b"2025-06-01T12:34:56.1234567890Z",  # 10 fraction digits
    b"2025-06-01T12:34:56..5Z",
    b"2025-06-01T12:34:56:00Z",
    b"2025-06-01  12:34:56Z",  # two spaces
    b"2025-06-01_12:34:56Z",
    b"2025/06/01T12:34:56Z",
    b"2025-06-01T12:34:56\x00",
    b"\x00" * 20,
    b"\xff\xfe\xfd",
    b"2025-06-01T12:34:56\xffZ",  # not UTF-8
    "２０２５-06-01T12:34:56Z".encode(),
    b"now",
    b"tomorrow",
    b"Sun, 01 Jun 2025 12:34:56 GMT",
]


@pytest.mark.parametrize("value, expected", VALID_DEADLINES, ids=lambda v: repr(v))
def test_parse_deadline_valid(impl, value, expected):
    assert impl.parse_deadline(value) == expected


@pytest.mark.parametrize("value", INVALID_DEADLINES, ids=lambda v: repr(v))
def test_parse_deadline_invalid(impl, value):
    assert impl.parse_deadline(value) is None
    parsed = impl.parse_headers([(HEADER_ID, b"x"), (HEADER_DEADLINE, value)])
    assert code(parsed) == "bad_deadline"
    assert parsed.deadline_us is None
    assert parsed.message_id == "x"  # partial result still filled in


def test_parse_deadline_rejects_non_bytes(impl):
    with pytest.raises(TypeError, match="deadline must be bytes, not str"):
        impl.parse_deadline("2025-06-01T12:34:56Z")
    with pytest.raises(TypeError):
        impl.parse_deadline(None)


def test_deadline_every_day_of_a_leap_and_common_year(impl):
    for year in (1, 1600, 1900, 1999, 2000, 2023, 2024, 2100, 9999):
        for month in range(1, 13):
            for day in range(1, 33):
                raw = b"%04d-%02d-%02dT06:07:08.5Z" % (year, month, day)
                try:
                    dt = datetime(year, month, day, 6, 7, 8, 500000, tzinfo=UTC)
                except ValueError:  # datetime says the day does not exist
                    assert impl.parse_deadline(raw) is None, raw
                else:
                    assert impl.parse_deadline(raw) == us(dt), raw


# ---------------------------------------------------------------------------
# parse_headers: valid messages
# ---------------------------------------------------------------------------


def test_typical_message(impl):
    headers = [
        ("traceparent", b"00-abc-def-01"),
        (HEADER_ID, b"order-42"),
        (HEADER_DEADLINE, b"2025-06-01T12:34:56.789Z"),
        (HEADER_TOPIC, b"orders.v1"),
        (HEADER_ORDERING_KEY, "clé".encode()),
        ("content-type", b"application/json"),
    ]
    parsed = impl.parse_headers(headers)
    assert type(parsed) is Parsed
    assert parsed == Parsed(
        error=None,
        message_id="order-42",
        deadline_us=us(datetime(2025, 6, 1, 12, 34, 56, 789000, tzinfo=UTC)),
        topic="orders.v1",
        ordering_key="clé",
        action=None,
        cron=None,
        timezone=None,
        headers=[("traceparent", b"00-abc-def-01"), ("content-type", b"application/json")],
    )
    # relayed headers are the very same tuples, in order
    assert parsed.headers[0] is headers[0] and parsed.headers[1] is headers[5]


def test_all_fields(impl):
    parsed = impl.parse_headers(
        [
            (HEADER_TIMEZONE, b"Europe/Paris"),
            (HEADER_CRON, b"*/5 * * * *"),
            (HEADER_ACTION, b"replace"),
            (HEADER_ORDERING_KEY, b"k"),
            (HEADER_TOPIC, b"t"),
            (HEADER_DEADLINE, b"0"),
            (HEADER_ID, b"i"),
        ]
    )
    assert parsed == Parsed(None, "i", 0, "t", "k", "replace", "*/5 * * * *", "Europe/Paris", [])


def test_headers_none_and_empty(impl):
    for headers in (None, [], ()):
        parsed = impl.parse_headers(headers)
        assert parsed.error == "missing_id: no chronosMessageId header"
        assert parsed.headers == []


def test_non_list_iterables(impl):
    items = [(HEADER_ID, b"a"), ("x", b"1"), (HEADER_DEADLINE, b"5")]
    expected = Parsed(None, "a", 5000, None, None, None, None, None, [("x", b"1")])
    assert impl.parse_headers(tuple(items)) == expected
    assert impl.parse_headers(iter(items)) == expected
    assert impl.parse_headers([list(i) for i in items]) == expected  # lists become tuples
    assert type(impl.parse_headers([list(i) for i in items]).headers[0]) is tuple


def test_other_headers_order_duplicates_none_and_unknown_chronos(impl):
    others = [
        ("b", b"1"),
        ("a", None),
        ("b", b"2"),
        ("b", b"1"),
        ("chronosUnknown", b"x"),
        ("chronosmessageid", b"lowercase"),
        ("ChronosMessageId", b"capital"),
        ("chronosMessageId ", b"trailing space"),
        (" chronosDeadline", b"leading space"),
        ("chronosDeadlin", b"short"),
        ("chronosDeadlines", b"long"),
        ("chronos", b""),
        ("", b""),
        ("ключ", "значение".encode()),
        ("bin", bytes(range(256))),
        ("text-value", "not bytes"),  # relayed as-is: only chronos values are checked
    ]
    headers = others[:3] + [(HEADER_ID, b"m")] + others[3:9] + [(HEADER_DEADLINE, b"7")] + others[9:]
    parsed = impl.parse_headers(headers)
    assert parsed.error is None
    assert parsed.message_id == "m" and parsed.deadline_us == 7000
    assert parsed.headers == others
    assert all(a is b for a, b in zip(parsed.headers, others))


def test_non_str_keys_are_relayed(impl):
    headers = [(b"chronosMessageId", b"x"), (None, b"y"), (HEADER_ID, b"id"), (HEADER_DEADLINE, b"1")]
    parsed = impl.parse_headers(headers)
    assert parsed.error is None
    assert parsed.headers == headers[:2]


def test_chronos_value_must_be_bytes_or_none(impl):
    with pytest.raises(TypeError, match="value of header chronosMessageId must be bytes or None, not str"):
        impl.parse_headers([(HEADER_ID, "abc")])


def test_malformed_items_raise(impl):
    with pytest.raises(ValueError):
        impl.parse_headers([(HEADER_ID, b"a", b"extra")])
    with pytest.raises(TypeError):
        impl.parse_headers([42])


# ---------------------------------------------------------------------------
# parse_headers: each reason code
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected_id, error",
    [
        (b"a", "a", None),
        (b"x" * 128, "x" * 128, None),
        ("é".encode() * 128, "é" * 128, None),  # 256 bytes but 128 characters
        ("🙂".encode() * 128, "🙂" * 128, None),
        (b" padded ", " padded ", None),
        (None, None, "empty_id: chronosMessageId is empty or null"),
        (b"", None, "empty_id: chronosMessageId is empty or null"),
        (b"\xff", None, "bad_id: chronosMessageId is not valid UTF-8 or contains NUL"),
        (b"ok\xc3", None, "bad_id: chronosMessageId is not valid UTF-8 or contains NUL"),  # truncated sequence
        (b"\xc0\xaf", None, "bad_id: chronosMessageId is not valid UTF-8 or contains NUL"),  # overlong
        (b"\xed\xa0\x80", None, "bad_id: chronosMessageId is not valid UTF-8 or contains NUL"),  # surrogate
        (b"x" * 129, None, "id_too_long: chronosMessageId has 129 characters (max 128)"),
        ("é".encode() * 129, None, "id_too_long: chronosMessageId has 129 characters (max 128)"),
        (b"x" * 1000, None, "id_too_long: chronosMessageId has 1000 characters (max 128)"),
    ],
)
def test_message_id(impl, value, expected_id, error):
    parsed = impl.parse_headers([(HEADER_ID, value), (HEADER_DEADLINE, b"1")])
    assert parsed.error == error
    assert parsed.message_id == expected_id
    assert parsed.deadline_us == 1000


def test_missing_id(impl):
    parsed = impl.parse_headers([(HEADER_DEADLINE, b"1"), ("k", b"v")])
    assert parsed.error == "missing_id: no chronosMessageId header"
    assert parsed.deadline_us == 1000
    assert parsed.headers == [("k", b"v")]


@pytest.mark.parametrize(
    "value, expected",
    [(b"cancel", "cancel"), (b"replace", "replace")]
    + [(v, None) for v in (None, b"", b"Cancel", b"CANCEL", b"cancel ", b"delete", b"\xff", b"replace\x00")],
)
def test_action(impl, value, expected):
    parsed = impl.parse_headers([(HEADER_ID, b"i"), (HEADER_DEADLINE, b"1"), (HEADER_ACTION, value)])
    assert parsed.action == expected
    if expected is None:
        assert parsed.error == "bad_action: chronosAction must be 'cancel' or 'replace'"
    else:
        assert parsed.error is None


def test_deadline_required_unless_cancel_or_cron(impl):
    base = [(HEADER_ID, b"i")]
    assert impl.parse_headers(base).error == "missing_deadline: no chronosDeadline header"
    assert impl.parse_headers(base + [(HEADER_ACTION, b"replace")]).error.startswith("missing_deadline:")
    cancel = impl.parse_headers(base + [(HEADER_ACTION, b"cancel")])
    assert cancel.error is None and cancel.action == "cancel" and cancel.deadline_us is None
    cron = impl.parse_headers(base + [(HEADER_CRON, b"0 * * * *")])
    assert cron.error is None and cron.cron == "0 * * * *" and cron.deadline_us is None
    # a present deadline must still be valid
    assert code(impl.parse_headers(base + [(HEADER_ACTION, b"cancel"), (HEADER_DEADLINE, b"x")])) == "bad_deadline"
    assert code(impl.parse_headers(base + [(HEADER_CRON, b"* * * * *"), (HEADER_DEADLINE, b"")])) == "bad_deadline"
    ok = impl.parse_headers(base + [(HEADER_CRON, b"* * * * *"), (HEADER_DEADLINE, b"10")])
    assert ok.error is None and ok.deadline_us == 10000
    # a bad action does not make the deadline optional, but is reported first
    assert code(impl.parse_headers(base + [(HEADER_ACTION, b"nope")])) == "bad_action"
    # timezone alone does not make the deadline optional
    assert code(impl.parse_headers(base + [(HEADER_TIMEZONE, b"UTC")])) == "missing_deadline"


@pytest.mark.parametrize("value", [None, b""])
def test_empty_deadline(impl, value):
    parsed = impl.parse_headers([(HEADER_ID, b"i"), (HEADER_DEADLINE, value)])
    assert parsed.error == "bad_deadline: chronosDeadline is empty or null"


def test_bad_deadline_detail(impl):
    parsed = impl.parse_headers([(HEADER_ID, b"i"), (HEADER_DEADLINE, b"soon")])
    assert parsed.error == (
        "bad_deadline: chronosDeadline is neither epoch milliseconds nor an ISO-8601 "
        "timestamp within 0001-01-01..9999-12-31 UTC"
    )


@pytest.mark.parametrize(
    "value, ok",
    [
        (b"a", True),
        (b"orders", True),
        (b"my.topic-name_V2", True),
        (b"a" * 249, True),
        (b"...", True),
        (b"-", True),
        (b"_", True),
        (b"0", True),
        (None, False),
        (b"", False),
        (b".", False),
        (b"..", False),
        (b"a" * 250, False),
        (b"my topic", False),
        (b"a/b", False),
        (b"a:b", False),
        (b"t\xc3\xa9", False),
        (b"\xff", False),
        (b"topic\x00", False),
        (b"topic\n", False),
    ],
)
def test_topic(impl, value, ok):
    parsed = impl.parse_headers([(HEADER_ID, b"i"), (HEADER_DEADLINE, b"1"), (HEADER_TOPIC, value)])
    if ok:
        assert parsed.error is None
        assert parsed.topic == value.decode()
    else:
        assert parsed.error == (
            "bad_topic: chronosTopic must be 1-249 characters of [A-Za-z0-9._-] and not '.' or '..'"
        )
        assert parsed.topic is None


@pytest.mark.parametrize(
    "value, ok",
    [
        (b"k", True),
        (b"customer 42 / eu", True),
        (b"k" * 256, True),
        ("é".encode() * 256, True),
        (None, False),
        (b"", False),
        (b"k" * 257, False),
        ("é".encode() * 257, False),
        (b"\xff", False),
        (b"\xed\xa0\x80", False),
    ],
)
def test_ordering_key(impl, value, ok):
    parsed = impl.parse_headers([(HEADER_ID, b"i"), (HEADER_DEADLINE, b"1"), (HEADER_ORDERING_KEY, value)])
    if ok:
        assert parsed.error is None and parsed.ordering_key == value.decode()
    else:
        assert parsed.error == (
            "bad_ordering_key: chronosOrderingKey must be non-empty UTF-8 of at most 256 characters"
        )
        assert parsed.ordering_key is None


@pytest.mark.parametrize("value", [None, b"", b"\xff", b"\x80abc"])
def test_bad_cron_and_timezone(impl, value):
    base = [(HEADER_ID, b"i"), (HEADER_DEADLINE, b"1")]
    cron = impl.parse_headers(base + [(HEADER_CRON, value)])
    assert cron.error == "bad_cron: chronosCron must be non-empty UTF-8" and cron.cron is None
    zone = impl.parse_headers(base + [(HEADER_TIMEZONE, value), (HEADER_CRON, b"* * * * *")])
    assert zone.error == "bad_cron: chronosTimeZone must be non-empty UTF-8"
    assert zone.timezone is None and zone.cron == "* * * * *"
    both = impl.parse_headers(base + [(HEADER_TIMEZONE, value), (HEADER_CRON, value)])
    assert both.error == "bad_cron: chronosCron must be non-empty UTF-8"


def test_cron_and_timezone_are_only_extracted(impl):
    parsed = impl.parse_headers(
        [(HEADER_ID, b"i"), (HEADER_CRON, "not a cron ✓".encode()), (HEADER_TIMEZONE, b"Mars/Olympus")]
    )
    assert parsed.error is None
    assert (parsed.cron, parsed.timezone) == ("not a cron ✓", "Mars/Olympus")


@pytest.mark.parametrize(
    "key", [HEADER_ID, HEADER_DEADLINE, HEADER_ACTION, HEADER_TOPIC, HEADER_ORDERING_KEY, HEADER_CRON, HEADER_TIMEZONE]
)
def test_duplicate_each_chronos_header(impl, key):
    headers = valid(**{HEADER_TOPIC: b"t", HEADER_ORDERING_KEY: b"k", HEADER_ACTION: b"replace",
                       HEADER_CRON: b"c", HEADER_TIMEZONE: b"z"})
    value = dict(headers)[key]
    parsed = impl.parse_headers(headers + [("other", b"o"), (key, value)])
    assert parsed.error == f"duplicate_header: {key} appears more than once"
    assert parsed.headers == [("other", b"o")]
    assert parsed.message_id == "msg-1"  # first occurrence still parsed


def test_duplicate_reports_first_repeated_key(impl):
    headers = [
        (HEADER_TOPIC, b"t"),
        (HEADER_ID, b"a"),
        (HEADER_ID, b"b"),
        (HEADER_TOPIC, b"u"),
        (HEADER_DEADLINE, b"1"),
    ]
    assert impl.parse_headers(headers).error == "duplicate_header: chronosMessageId appears more than once"


def test_duplicate_of_an_invalid_header(impl):
    parsed = impl.parse_headers([(HEADER_ID, None), (HEADER_ID, None)])
    assert parsed.error == "duplicate_header: chronosMessageId appears more than once"


# Defects that trigger each reason code (and as few others as possible).
_DEFECTS = {
    "duplicate_header": lambda h: h + [(HEADER_ORDERING_KEY, b"k2")],
    "missing_id": lambda h: [(k, v) for k, v in h if k != HEADER_ID],
    "empty_id": lambda h: [(k, b"" if k == HEADER_ID else v) for k, v in h],
    "bad_id": lambda h: [(k, b"\xff" if k == HEADER_ID else v) for k, v in h],
    "id_too_long": lambda h: [(k, b"i" * 129 if k == HEADER_ID else v) for k, v in h],
    "bad_action": lambda h: [(k, b"delete" if k == HEADER_ACTION else v) for k, v in h],
    "missing_deadline": lambda h: [(k, v) for k, v in h if k != HEADER_DEADLINE],
    "bad_deadline": lambda h: [(k, b"tomorrow" if k == HEADER_DEADLINE else v) for k, v in h],
    "bad_topic": lambda h: [(k, b"no spaces" if k == HEADER_TOPIC else v) for k, v in h],
    "bad_ordering_key": lambda h: [(k, b"" if k == HEADER_ORDERING_KEY else v) for k, v in h],
    "bad_cron": lambda h: [(k, b"" if k == HEADER_TIMEZONE else v) for k, v in h],
}
_GROUP = {
    "missing_id": "id", "empty_id": "id", "bad_id": "id", "id_too_long": "id",
    "missing_deadline": "deadline", "bad_deadline": "deadline",
}


def _base_for_priority():
    return [
        ("x-first", b"1"),
        (HEADER_ID, b"id"),
        (HEADER_ACTION, b"replace"),
        (HEADER_DEADLINE, b"2025-01-01T00:00:00Z"),
        (HEADER_TOPIC, b"topic"),
        (HEADER_ORDERING_KEY, b"key"),
        (HEADER_TIMEZONE, b"UTC"),
        ("x-last", None),
    ]


def test_priority_order_is_fixed(impl):
    assert tuple(_DEFECTS) == REASON_CODES
    assert impl.parse_headers(_base_for_priority()).error is None
    for i, expected in enumerate(REASON_CODES):
        headers = _base_for_priority()
        groups = set()
        # apply this defect plus one defect of every lower-priority group, lowest first
        for name in reversed(REASON_CODES[i:]):
            group = _GROUP.get(name, name)
            if name != expected and (group == _GROUP.get(expected, expected) or group in groups):
                continue
            groups.add(group)
            headers = _DEFECTS[name](headers)
        parsed = impl.parse_headers(headers)
        assert code(parsed) == expected, (expected, headers, parsed.error)
        # only the defect itself: same code
        assert code(impl.parse_headers(_DEFECTS[expected](_base_for_priority()))) == expected
        assert parsed.headers == [("x-first", b"1"), ("x-last", None)]


def test_partial_results_on_error(impl):
    parsed = impl.parse_headers(
        [(HEADER_ID, b"ok"), (HEADER_DEADLINE, b"1"), (HEADER_TOPIC, b"bad topic"), (HEADER_ORDERING_KEY, b"k")]
    )
    assert code(parsed) == "bad_topic"
    assert (parsed.message_id, parsed.deadline_us, parsed.topic, parsed.ordering_key) == ("ok", 1000, None, "k")


# ---------------------------------------------------------------------------
# storage encoding
# ---------------------------------------------------------------------------


def test_encode_known_bytes(impl):
    headers = [("a", b"xy"), ("é", None), ("", b"")]
    expected = (
        b"\x00\x00\x00\x01a\x00\x00\x00\x02xy"
        b"\x00\x00\x00\x02\xc3\xa9\xff\xff\xff\xff"
        b"\x00\x00\x00\x00\x00\x00\x00\x00"
    )
    assert impl.encode_headers(headers) == expected
    assert impl.decode_headers(expected) == headers


def test_encode_empty(impl):
    assert impl.encode_headers(None) == b""
    assert impl.encode_headers([]) == b""
    assert impl.encode_headers(()) == b""
    assert impl.decode_headers(b"") == []
    assert impl.decode_headers(None) == []


def test_round_trip(impl):
    headers = [
        ("k", b"v"),
        ("k", b"v"),
        ("k", None),
        ("empty", b""),
        ("bin", bytes(range(256)) * 3),
        ("ключ🙂", "значение".encode()),
        ("chronosMessageId", b"kept as-is"),
        ("", None),
    ]
    data = impl.encode_headers(headers)
    decoded = impl.decode_headers(data)
    assert decoded == headers
    assert all(type(item) is tuple for item in decoded)
    assert impl.encode_headers(decoded) == data
    assert impl.decode_headers(bytearray(data)) == headers
    assert impl.decode_headers(memoryview(data)) == headers
    assert impl.encode_headers(iter(headers)) == data
    assert impl.encode_headers([list(h) for h in headers]) == data


def test_encode_type_errors(impl):
    with pytest.raises(TypeError, match="header key must be str, not bytes"):
        impl.encode_headers([(b"k", b"v")])
    with pytest.raises(TypeError, match="value of header k must be bytes or None, not str"):
        impl.encode_headers([("k", "v")])
    with pytest.raises(TypeError):
        impl.encode_headers([("k", bytearray(b"v"))])
    with pytest.raises(UnicodeEncodeError):
        impl.encode_headers([("\ud800", b"v")])  # lone surrogate
    with pytest.raises(ValueError):
        impl.encode_headers([("k", b"v", b"extra")])
    with pytest.raises(TypeError, match="encoded headers must be"):
        impl.decode_headers("text")


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x00", "truncated at offset 0"),
        (b"\x00\x00\x00", "truncated at offset 0"),
        (b"\x00\x00\x00\x05ab", "truncated at offset 4"),
        (b"\xff\xff\xff\xffab", "truncated at offset 4"),
        (b"\x00\x00\x00\x01a", "truncated at offset 5"),
        (b"\x00\x00\x00\x01a\x00\x00", "truncated at offset 5"),
        (b"\x00\x00\x00\x01a\x00\x00\x00\x05xy", "truncated at offset 9"),
        (b"\x00\x00\x00\x01a\x7f\xff\xff\xffxy", "truncated at offset 9"),
        (b"\x00\x00\x00\x01a\xff\xff\xff\xfe", "invalid value length -2 at offset 5"),
        (b"\x00\x00\x00\x01a\x80\x00\x00\x00", "invalid value length -2147483648 at offset 5"),
        (b"\x00\x00\x00\x01\xff\x00\x00\x00\x00", "key at offset 4 is not valid UTF-8"),
        (b"\x00\x00\x00\x01a\xff\xff\xff\xff\x00", "truncated at offset 9"),  # trailing garbage
    ],
)
def test_decode_corrupt(impl, data, message):
    with pytest.raises(ValueError, match="corrupt header data: " + message):
        impl.decode_headers(data)


def test_decode_every_truncation_raises(impl):
    data = impl.encode_headers([("key", b"value"), ("n", None), ("e", b"")])
    boundaries = {0, 16, 25, len(data)}  # cutting between headers leaves a valid prefix
    assert impl.decode_headers(data[:16]) == [("key", b"value")]
    assert impl.decode_headers(data[:25]) == [("key", b"value"), ("n", None)]
    for cut in set(range(len(data))) - boundaries:
        with pytest.raises(ValueError, match="corrupt header data"):
            impl.decode_headers(data[:cut])


# ---------------------------------------------------------------------------
# loader
# ---------------------------------------------------------------------------


def test_implementations_are_distinct_modules():
    py, native = implementation("python"), implementation("native")
    assert py.IMPL == "python" and native.IMPL == "native"
    assert py is not native
    for name in ("parse_headers", "parse_deadline", "encode_headers", "decode_headers", "read_headers"):
        assert callable(getattr(py, name)) and callable(getattr(native, name))
    assert py.Parsed is native.Parsed is Parsed


def test_loader_exports():
    assert codec.IMPL in ("native", "python")
    module = implementation(codec.IMPL)
    assert codec.parse_headers is module.parse_headers
    assert codec.decode_headers is module.decode_headers
    assert codec.read_headers is module.read_headers
    assert codec.HEADER_ID == "chronosMessageId" and codec.MAX_ID_LENGTH == 128
    assert codec.MAX_DEADLINE_MS == 253402300799999


def test_loader_selection(monkeypatch):
    assert codec._select("python").IMPL == "python"
    assert codec._select("native").IMPL == "native"
    assert codec._select(" Native ").IMPL == "native"
    assert codec._select("").IMPL == "native"  # auto prefers native when built
    assert codec._select(None).IMPL == "native"
    with pytest.raises(ValueError, match="invalid CHRONOS_IMPL='cython'"):
        codec._select("cython")
    with pytest.raises(ValueError, match="unknown codec implementation"):
        implementation("rust")


def test_loader_native_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "chronos.codec._native", None)  # makes the import fail
    with pytest.raises(ImportError, match="CHRONOS_IMPL=native but the native codec could not be loaded"):
        codec._select("native")
    assert codec._select("").IMPL == "python"
    assert codec._select("python").IMPL == "python"


@pytest.mark.parametrize("value, expected", [("python", "python"), ("native", "native"), ("", "native")])
def test_loader_env_var_subprocess(value, expected):
    env = {**os.environ, "CHRONOS_IMPL": value, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", "import chronos.codec as c; print(c.IMPL)"],
        env=env, capture_output=True, text=True, check=True, cwd=ROOT,
    )
    assert out.stdout.strip() == expected


def test_loader_env_var_invalid_subprocess():
    env = {**os.environ, "CHRONOS_IMPL": "fast", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", "import chronos.codec"], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode != 0
    assert "ValueError: invalid CHRONOS_IMPL='fast'" in out.stderr


@pytest.mark.parametrize("header", ["chronosMessageId", "chronosOrderingKey", "chronosCron", "chronosTimeZone"])
def test_nul_in_text_fields_is_invalid_because_postgres_text_cannot_hold_it(impl, header):
    headers = [("chronosMessageId", b"id"), ("chronosDeadline", b"1700000000000")]
    headers = [h for h in headers if h[0] != header] + [(header, b"a\x00b")]
    result = impl.parse_headers(headers)
    assert result.error is not None
    assert result.error.split(":")[0] in ("bad_id", "bad_ordering_key", "bad_cron")
