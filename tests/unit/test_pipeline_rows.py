"""Bulk scheduling's row validation (pure, no Spark): columns → headers → the consumer's rules."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import date, datetime, timedelta, timezone

import pytest

from chronos import codec
from chronos.pipeline.rows import BadHeaders, Stats, build, deadline_header, header_list, iso_micros

NOW = 1_800_000_000_000_000
RULES_ARGS = dict(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile(r"out|billing\..*"))


def rules(**kw):
    from chronos.domain.intake import Rules
    return Rules(**{**RULES_ARGS, **kw})


def check(id="m1", deadline=str(NOW // 1000 + 60_000), topic=None, ordering_key=None, headers=None,
          key=b"k", value=b"v", now=NOW, **kw):
    return build(id, deadline, topic, ordering_key, headers, key, value, now, rules(**kw))


def test_valid_row_becomes_a_store_row():
    row, reason, due = check(topic="billing.eu", ordering_key="cust-1", headers='{"a": "1", "b": null}')
    assert reason is None and not due
    assert (row.id, row.deadline_us, row.topic, row.key, row.value, row.ordering_key) == \
        ("m1", NOW + 60_000_000, "billing.eu", b"k", b"v", "cust-1")
    assert codec.decode_headers(row.headers) == [("a", b"1"), ("b", None)]


def test_output_topic_is_stored_as_null_like_the_consumer_does():
    row, _, _ = check(topic="out")
    assert row.topic is None


@pytest.mark.parametrize("kw,code", [
    (dict(id=None), "missing_id"),
    (dict(id=""), "empty_id"),
    (dict(id="x" * 129), "id_too_long"),
    (dict(deadline=None), "missing_deadline"),
    (dict(deadline="next tuesday"), "bad_deadline"),
    (dict(deadline=-5), "bad_deadline"),
    (dict(deadline=1.5e12 + 0.5), "bad_deadline"),
    (dict(topic="no spaces"), "bad_topic"),
    (dict(topic="payments"), "topic_not_allowed"),
    (dict(ordering_key=""), "bad_ordering_key"),
    (dict(headers="{not json"), "bad_headers"),
    (dict(headers='[["a"]]'), "bad_headers"),
    (dict(headers='{"a": 1}'), "bad_headers"),
    (dict(headers='"text"'), "bad_headers"),
    (dict(headers='{"chronosMessageId": "other"}'), "duplicate_header"),
    (dict(headers='{"chronosAction": "cancel"}'), "bad_action"),
    (dict(headers='{"chronosCron": "* * * * *"}'), "bad_cron"),
    (dict(deadline=str(NOW // 1000 - 10_000), max_lateness_us=1_000_000), "too_late"),
])
def test_invalid_rows_get_the_consumers_reason(kw, code):
    row, reason, due = check(**kw)
    assert row is None and reason.split(":", 1)[0] == code, reason


def test_reasons_are_the_codecs_own_texts():
    _, reason, _ = check(deadline="garbage")
    assert reason == codec.parse_headers([("chronosMessageId", b"m"), ("chronosDeadline", b"garbage")]).error


def test_late_rows_are_stored_and_counted_as_due():
    row, reason, due = check(deadline=str(NOW // 1000 - 5_000))
    assert reason is None and due and row.deadline_us == NOW - 5_000_000


@pytest.mark.parametrize("value,expected_us", [
    ("2027-01-15T08:00:00.123456Z", None),
    (1_800_000_000_123, 1_800_000_000_123_000),
    (1_800_000_000_123.0, 1_800_000_000_123_000),
    (datetime(2027, 1, 15, 8, 0, 0, 123456, tzinfo=timezone.utc), None),
    (datetime(2027, 1, 15, 10, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2))), None),
    (datetime(2027, 1, 15, 8, 0, 0, 123456), None),  # naive: UTC
    (date(2027, 1, 15), None),
])
def test_deadline_cells(value, expected_us):
    parsed = codec.parse_deadline(deadline_header(value))
    if expected_us is None:
        if isinstance(value, date) and not isinstance(value, datetime):
            value = datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
        elif isinstance(value, str):
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        elif value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        expected_us = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    assert parsed == expected_us


def test_iso_micros_round_trips_through_the_codec():
    for us in (0, 1, 999_999, NOW + 7, -1_000_001, 253402300799999999):
        assert codec.parse_deadline(iso_micros(us).encode()) == us


def test_header_shapes():
    expected = [("a", b"1"), ("a", b"2"), ("b", None)]
    assert header_list('[["a", "1"], ["a", "2"], ["b", null]]') == expected
    assert header_list([{"key": "a", "value": b"1"}, {"key": "a", "value": "2"}, {"key": "b", "value": None}]) == expected
    assert header_list([("a", "1"), ("a", "2"), ("b", None)]) == expected  # a map column
    assert header_list('{"a": "1", "b": null}') == [("a", b"1"), ("b", None)]
    assert header_list(None) == [] and header_list("") == [] and header_list("[]") == []
    with pytest.raises(BadHeaders):
        header_list([(1, "x")])


def test_stats_merge_and_derived_counts():
    a, b = Stats(read=10, valid=8, scheduled=5, due=1), Stats(read=4, valid=4, scheduled=4)
    a.reject("bad_deadline: x")
    a.reject("bad_deadline: y")
    b.reject("empty_id: z")
    a.merge(b)
    assert (a.read, a.valid, a.scheduled, a.already_waiting, a.rejected_total) == (14, 12, 9, 3, 3)
    assert a.rejected == {"bad_deadline": 2, "empty_id": 1}


def test_service_processes_never_import_pyspark():
    """The consumer, firer, detector, `chronos up` and the CLI (with the pipeline and console
    commands) stay free of PySpark and of the console's web framework."""
    code = ("import sys\n"
            "import chronos.roles.consumer, chronos.roles.firer, chronos.roles.detector, chronos.cli, chronos.up.command\n"
            "import chronos.console.launch\n"
            "chronos.cli.build_parser()\n"
            "import chronos.commands.pipeline, chronos.pipeline.rows\n"
            "heavy = ('pyspark', 'py4j', 'pandas', 'matplotlib', 'starlette', 'uvicorn', 'jinja2', 'playwright')\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True)
