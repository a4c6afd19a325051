"""How the console shows bytes, and how message ids travel in URLs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronos.console.views import id_from_path, message_url, show_bytes


def test_printable_utf8_is_text_and_the_rest_is_hex():
    assert show_bytes(b"<script>alert(1)</script>").kind == "text"  # the template escapes it
    assert show_bytes("line one\nné".encode()).text == "line one\nné"
    binary = show_bytes(b"\x00\xff\x10")
    assert (binary.kind, binary.text, binary.size) == ("hex", "00 ff 10", 3)
    assert show_bytes(b"bell\x07").kind == "hex"
    assert show_bytes(None).kind == "null"


def test_a_long_value_is_cut_without_breaking_a_character():
    shown = show_bytes("é".encode() * 10, limit=5)
    assert (shown.kind, shown.text, shown.size, shown.truncated) == ("text", "éé", 20, True)


@pytest.mark.parametrize("raw", [b"/messages/%FF", b"/messages/", b"/messages/a%00b", b"/other/x",
                                 b"/messages/" + b"x" * 129])
def test_malformed_ids_in_paths_are_refused(raw):
    assert id_from_path(raw) is None


@given(st.text(min_size=1, max_size=128).filter(lambda t: "\x00" not in t))
def test_every_id_survives_its_url(message_id):
    assert id_from_path(message_url(message_id).encode("ascii")) == message_id


def test_a_preview_knows_the_size_of_the_whole():
    shown = show_bytes(b"abc", size=100)
    assert (shown.text, shown.size, shown.truncated) == ("abc", 100, True)
