"""Property tests: both codec implementations agree and behave correctly on arbitrary input."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chronos.codec import (
    CHRONOS_HEADERS,
    MAX_DEADLINE_MS,
    MAX_DEADLINE_US,
    MIN_DEADLINE_US,
    REASON_CODES,
    Parsed,
    implementation,
)

PY = implementation("python")
NATIVE = implementation("native")
IMPLS = (PY, NATIVE)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ---------------------------------------------------------------

near_keys = st.sampled_from(
    [
        "chronosmessageid",
        "ChronosMessageId",
        "chronosMessageId ",
        "chronosDeadlin",
        "chronosTimezone",
        "chronosFoo",
        "chronos",
        "",
        "chronosMessageIdé",
        "chronosCrón",
    ]
)
keys = st.one_of(st.sampled_from(CHRONOS_HEADERS), near_keys, st.text(max_size=20))


@st.composite
def near_iso(draw) -> bytes:
    """Mostly well-formed ISO-8601 strings; each part is occasionally defective."""

    def bad() -> bool:  # ~1 in 25 per part, so about half of the strings are valid
        return draw(st.integers(0, 24)) == 12  # (mid value: hypothesis favours bounds)

    def num(width: int, lo: int, hi: int, bad_lo: int, bad_hi: int) -> str:
        if bad():
            w = draw(st.sampled_from([width - 1, width + 1]))
            return str(draw(st.integers(bad_lo, bad_hi))).zfill(w)[-w:] if w > 0 else ""
        if bad():
            return f"{draw(st.integers(bad_lo, bad_hi)):0{width}d}"[-width:]
        return f"{draw(st.integers(lo, hi)):0{width}d}"

    def sep(good: str, wrong: str) -> str:
        return draw(st.sampled_from(wrong)) if bad() else draw(st.sampled_from(good))

    s = num(4, 1, 9999, 0, 10000) + sep("-", "/_ :") + num(2, 1, 12, 0, 13) + sep("-", "/_ ")
    s += num(2, 1, 28, 0, 32) if draw(st.integers(0, 3)) != 2 else num(2, 29, 31, 0, 32)
    s += draw(st.sampled_from(["T", "t", " ", "", "  ", "x"])) if bad() else draw(st.sampled_from("Tt "))
    s += num(2, 0, 23, 0, 25) + sep(":", ".-") + num(2, 0, 59, 0, 61)
    if draw(st.booleans()):
        s += sep(":", ".,") + num(2, 0, 59, 0, 61)
        if draw(st.booleans()):
            n_digits = draw(st.integers(0, 11)) if bad() else draw(st.integers(1, 9))
            s += sep(".,", ":") + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=n_digits, max_size=n_digits)))
    elif bad():
        s += "." + draw(st.sampled_from(["5", "123"]))  # fraction without seconds
    if bad():
        s += draw(st.sampled_from(["ZZ", "UTC", " ", "+", "-", "Z ", "+05:30Z", "+5", "+05:3", "+053", "+05:", "+05::30"]))
    else:
        s += draw(
            st.one_of(
                st.sampled_from(["", "Z", "z"]),
                st.builds(
                    lambda sign, h, form, m: f"{sign}{h:02d}" if form == "" and m == 0 else f"{sign}{h:02d}{form}{m:02d}",
                    st.sampled_from("+-"),
                    st.integers(0, 25),
                    st.sampled_from(["", ":"]),
                    st.integers(0, 61),
                ),
            )
        )
    return s.encode()


deadline_like = st.one_of(
    near_iso(),
    st.integers(0, 10**16).map(lambda v: str(v).encode()),
    st.text(alphabet="0123456789-:Tt Zz+.,", max_size=35).map(str.encode),
    st.binary(max_size=40),
)

values = st.one_of(
    st.none(),
    st.just(b""),
    st.binary(max_size=40),
    st.sampled_from([b"cancel", b"replace", b"orders", b".", b"..", b"x" * 129, b"k" * 257, b"\xff"]),
    st.text(max_size=150).map(lambda t: t.encode("utf-8", "surrogatepass")),
    deadline_like,
)
header_lists = st.lists(st.tuples(keys, values), max_size=12)


@st.composite
def mostly_valid_headers(draw):
    """Header lists that are often valid, so the success path is exercised too."""

    def maybe(good):
        return draw(st.one_of(good, values)) if draw(st.integers(0, 4)) == 2 else draw(good)

    chosen = {
        "chronosMessageId": maybe(st.text(min_size=1, max_size=130).map(str.encode)),
        "chronosDeadline": maybe(st.one_of(near_iso(), st.integers(0, MAX_DEADLINE_MS).map(lambda v: str(v).encode()))),
    }
    optional = {
        "chronosTopic": st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True).map(str.encode),
        "chronosOrderingKey": st.text(min_size=1, max_size=260).map(str.encode),
        "chronosAction": st.sampled_from([b"cancel", b"replace"]),
        "chronosCron": st.text(min_size=1, max_size=20).map(str.encode),
        "chronosTimeZone": st.text(min_size=1, max_size=20).map(str.encode),
    }
    for key, good in optional.items():
        if draw(st.booleans()):
            chosen[key] = maybe(good)
    items = [(k, v) for k, v in chosen.items() if draw(st.integers(0, 19)) != 10]
    items += draw(st.lists(st.tuples(st.one_of(near_keys, st.text(max_size=20)), values), max_size=4))
    if draw(st.integers(0, 9)) == 5 and items:
        items.append(draw(st.sampled_from(items)))  # occasional duplicate
    return draw(st.permutations(items))


def parse_both(headers):
    results = [impl.parse_headers(list(headers)) for impl in IMPLS]
    for r in results:
        assert type(r) is Parsed
    return results


def check_parsed(headers, parsed: Parsed) -> None:
    others = [h for h in headers if h[0] not in CHRONOS_HEADERS]
    assert parsed.headers == others
    if parsed.error is None:
        assert parsed.message_id is not None
    else:
        assert parsed.error.split(":", 1)[0] in REASON_CODES


# --- parse_headers ----------------------------------------------------------------


@FAST
@given(header_lists)
@example([("chronosMessageId", b"a"), ("chronosMessageId", None)])
@example([("chronosDeadline", b"1"), ("chronosAction", b"cancel")])
def test_parse_headers_implementations_agree(headers):
    py, native = parse_both(headers)
    assert py == native
    check_parsed(headers, py)


@FAST
@given(mostly_valid_headers())
def test_parse_headers_agree_on_mostly_valid(headers):
    py, native = parse_both(headers)
    assert py == native
    check_parsed(headers, py)
    if py.error is None:
        assert py.deadline_us is not None or py.action == "cancel" or py.cron is not None


# --- parse_deadline ---------------------------------------------------------------


@FAST
@given(deadline_like)
def test_parse_deadline_implementations_agree(value):
    py = PY.parse_deadline(value)
    assert py == NATIVE.parse_deadline(value)
    if py is not None:
        assert MIN_DEADLINE_US <= py <= MAX_DEADLINE_US


offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))


@st.composite
def iso_and_expected(draw):
    """An arbitrary datetime formatted in one of the accepted ISO shapes, plus its expected µs."""
    dt = draw(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)))
    tz = draw(st.one_of(st.none(), st.just(timezone.utc), offsets))
    with_seconds = draw(st.booleans())
    digits = draw(st.integers(0, 9)) if with_seconds else 0
    if not with_seconds:
        dt = dt.replace(second=0, microsecond=0)
    extra = draw(st.text(alphabet="0123456789", min_size=3, max_size=3))
    frac = (f"{dt.microsecond:06d}" + extra)[:digits]
    kept = int(frac[:6].ljust(6, "0")) if digits else 0
    dt = dt.replace(microsecond=kept)

    text = f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}{draw(st.sampled_from('Tt '))}{dt.hour:02d}:{dt.minute:02d}"
    if with_seconds:
        text += f":{dt.second:02d}"
        if digits:
            text += draw(st.sampled_from(".,")) + frac
    offset_minutes = 0
    if tz is timezone.utc:
        text += draw(st.sampled_from(["Z", "z", "+00:00", "-00:00", "+0000", "+00"]))
    elif tz is not None:
        offset_minutes = int(tz.utcoffset(None).total_seconds()) // 60
        sign = "-" if offset_minutes < 0 else "+"
        h, m = divmod(abs(offset_minutes), 60)
        shapes = [f"{sign}{h:02d}:{m:02d}", f"{sign}{h:02d}{m:02d}"] + ([f"{sign}{h:02d}"] if m == 0 else [])
        text += draw(st.sampled_from(shapes))
    # expectation from datetime arithmetic (independent of the codecs' day counting)
    naive_us = (dt.replace(tzinfo=None) - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    expected = naive_us - offset_minutes * 60_000_000
    if not MIN_DEADLINE_US <= expected <= MAX_DEADLINE_US:
        expected = None
    return text.encode(), expected


@FAST
@given(iso_and_expected())
@example((b"0001-01-01T00:00:00+00:01", None))
@example((b"9999-12-31T23:59:59.999999Z", MAX_DEADLINE_US))
def test_iso_datetimes_parse_to_the_right_microseconds(case):
    text, expected = case
    for impl in IMPLS:
        assert impl.parse_deadline(text) == expected, (impl.IMPL, text)


@FAST
@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)))
def test_isoformat_output_parses(dt):
    """Python's own isoformat() output (naive = UTC, and aware UTC) is accepted."""
    expected = (dt - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    for text in (dt.isoformat(), dt.isoformat(sep=" "), dt.replace(tzinfo=timezone.utc).isoformat()):
        for impl in IMPLS:
            assert impl.parse_deadline(text.encode()) == expected


@FAST
@given(st.integers(0, MAX_DEADLINE_MS), st.integers(0, 14))
def test_epoch_millis(ms, pad):
    text = str(ms)
    text = text.zfill(min(len(text) + pad, 15)).encode()
    for impl in IMPLS:
        assert impl.parse_deadline(text) == ms * 1000
        assert impl.parse_deadline(b"-" + text) is None
        assert impl.parse_deadline(text + b".0") is None


# --- storage encoding -------------------------------------------------------------

storable = st.lists(
    st.tuples(st.one_of(st.sampled_from(CHRONOS_HEADERS), st.text(max_size=12)), st.one_of(st.none(), st.binary(max_size=64))),
    max_size=10,
)


@FAST
@given(storable)
def test_encode_decode_round_trip(headers):
    py_data = PY.encode_headers(headers)
    assert NATIVE.encode_headers(headers) == py_data
    for impl in IMPLS:
        decoded = impl.decode_headers(py_data)
        assert decoded == headers
        assert all(type(k) is str and (v is None or type(v) is bytes) for k, v in decoded)
        assert impl.encode_headers(decoded) == py_data


def _decode_outcome(impl, data):
    try:
        return ("ok", impl.decode_headers(data))
    except ValueError as exc:
        return (type(exc), str(exc))


@FAST
@given(st.one_of(st.binary(max_size=60), storable.map(PY.encode_headers).flatmap(
    lambda d: st.tuples(st.just(d), st.integers(0, max(len(d) - 1, 0)), st.integers(0, 255)).map(
        lambda t: t[0][: t[1]] + bytes([t[2]]) + t[0][t[1] + 1 :]
    )
)))
def test_decode_arbitrary_bytes_agrees_and_only_raises_value_error(data):
    assert _decode_outcome(PY, data) == _decode_outcome(NATIVE, data)
