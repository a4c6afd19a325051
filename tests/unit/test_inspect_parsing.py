"""The operators' command-line values, parsed without I/O: times, delays, states, keys, cursors, filters."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from chronos.ops import inspect
from chronos.errors import ConfigError

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, expected", [
    ("10m", NOW + timedelta(minutes=10)),
    ("+1d", NOW + timedelta(days=1)),
    ("-2h", NOW - timedelta(hours=2)),
    ("500ms", NOW + timedelta(milliseconds=500)),
    ("1.5h", NOW + timedelta(minutes=90)),
    ("2w", NOW + timedelta(days=14)),
    ("2026-12-01T11:09:01.123Z", datetime(2026, 12, 1, 11, 9, 1, 123000, tzinfo=timezone.utc)),
    ("2026-12-01T11:09:01+02:00", datetime(2026, 12, 1, 9, 9, 1, tzinfo=timezone.utc)),
    ("2026-12-01 11:09", datetime(2026, 12, 1, 11, 9, tzinfo=timezone.utc)),
])
def test_times_are_iso_or_relative_to_now(text, expected):
    assert inspect.parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "10", "10x", "2026-13-01", "", "--", "1e3s", "10 m"])
def test_malformed_times_are_config_errors_naming_the_flag(text):
    with pytest.raises(ConfigError, match="--due-before"):
        inspect.parse_time(text, NOW, "--due-before")


def test_delays_are_never_negative():
    assert inspect.parse_delay("90s") == timedelta(seconds=90)
    with pytest.raises(ConfigError, match="negative"):
        inspect.parse_delay("-5m")
    with pytest.raises(ConfigError, match="--delay"):
        inspect.parse_delay("soon")


def test_states_and_keys():
    assert inspect.parse_state("In-Flight") == "in_flight" and inspect.parse_state(None) is None
    with pytest.raises(ConfigError, match="unknown state 'asleep'"):
        inspect.parse_state("asleep")
    assert inspect.parse_key("hex:00ff") == b"\x00\xff" and inspect.parse_key("naïve") == "naïve".encode()
    with pytest.raises(ConfigError, match="hex"):
        inspect.parse_key("hex:xyz")


def test_cursors_round_trip_and_foreign_ones_are_refused():
    c = inspect.encode_cursor("d", [1_790_000_000_000_000, 42])
    assert inspect.decode_cursor(c) == ("d", [1_790_000_000_000_000, 42])
    weird = "it's \"100%\" \\ 日本"
    assert inspect.decode_cursor(inspect.encode_cursor("i", [weird])) == ("i", [weird])
    for bad in ["", "abc", inspect.encode_cursor("d", ["x", 1]), inspect.encode_cursor("z", [1]), "!!!"]:
        with pytest.raises(ConfigError, match="cursor"):
            inspect.decode_cursor(bad)


def test_the_output_topic_filter_becomes_a_flag_and_bad_combinations_are_refused():
    f = inspect.filters_for(output_topic="out", topic="out")
    assert f.topic is None and f.output_topic
    assert inspect.filters_for(output_topic="out", topic="billing").topic == "billing"
    with pytest.raises(ConfigError, match="before"):
        inspect.filters_for(output_topic="out", due_after=NOW, due_before=NOW)
    with pytest.raises(ConfigError, match="empty"):
        inspect.filters_for(output_topic="out", id_prefix="")


def test_terminal_text_is_escaped_and_binary_is_hex():
    assert inspect.safe_text(b"<script>\n") == "hex:3c7363726970743e0a"
    assert inspect.safe_text(b"it's") == '"it\'s"'
    assert inspect.safe_text(b"\xff\x00") == "hex:ff00"
    assert inspect.safe_text(None) == "null"
    assert inspect.safe_text(b"a" * 70, 64).endswith("...")
    assert inspect.bytes_json(b"\xff") == {"text": None, "hex": "ff"}
