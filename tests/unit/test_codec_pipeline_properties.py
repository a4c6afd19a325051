"""Property tests of the codec along the message's path: parse (consumer) → encode (store) → decode (firer).

For any header list: both implementations give the same answer, nothing raises (an invalid list
is a `Parsed` with an error, never an exception), and the headers that are relayed come out
byte-exact whichever implementation stored them and whichever reads them.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chronos.codec import CHRONOS_HEADERS, REASON_CODES, Parsed
from test_codec_properties import IMPLS, header_lists, keys, mostly_valid_headers, values

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

big_lists = st.lists(st.tuples(keys, st.one_of(values, st.binary(min_size=1000, max_size=20000))), max_size=60)
any_headers = st.one_of(header_lists, mostly_valid_headers(), big_lists)


@FAST
@given(any_headers)
@example(None)
@example([])
@example([("chronosMessageId", b"x")] * 3)
@example([("", b""), ("\x00", None), ("chronosMessageId\x00", b"\x00")])
def test_parse_store_and_fire_relay_other_headers_byte_exact(headers):
    results = [impl.parse_headers(headers) for impl in IMPLS]
    assert all(type(r) is Parsed for r in results)
    assert results[0] == results[1]
    parsed = results[0]
    relayed = [h for h in headers or [] if h[0] not in CHRONOS_HEADERS]
    assert parsed.headers == relayed
    assert parsed.error is None or parsed.error.split(":", 1)[0] in REASON_CODES
    stored = [impl.encode_headers(parsed.headers) for impl in IMPLS]
    assert stored[0] == stored[1]
    for impl in IMPLS:  # a consumer of either implementation stored it; a firer of either reads it
        decoded = impl.decode_headers(stored[0])
        assert decoded == relayed
        assert all(type(k) is str and (v is None or type(v) is bytes) for k, v in decoded)


@FAST
@given(any_headers)
def test_any_iterable_of_headers_gives_the_same_answer(headers):
    """confluent-kafka hands over a list of tuples; tuples of tuples or generators must not change anything."""
    for impl in IMPLS:
        expected = impl.parse_headers(headers)
        assert impl.parse_headers(tuple(headers)) == expected
        assert impl.parse_headers(iter(list(headers))) == expected
