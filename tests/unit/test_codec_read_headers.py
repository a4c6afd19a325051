"""read_headers: a consumed message's headers read from librdkafka's list, on both implementations.

The messages are real ``confluent_kafka.Message`` objects holding a librdkafka header list, as a
consumer hands them over (built without a broker by tests/rdkafka_raw.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Message

from chronos.codec import implementation, librdkafka
from chronos.roles.consumer import sort_batch
from chronos.domain.intake import Rules
from rdkafka_raw import message_with_headers

ROOT = Path(__file__).resolve().parents[2]
NOW_US = 1_700_000_000_000_000

pytestmark = pytest.mark.skipif(librdkafka.BINDING is None, reason=f"raw path off: {librdkafka.PROBLEM}")


@pytest.fixture(params=["python", "native"])
def impl(request):
    return implementation(request.param)


def code(error: str | None) -> str | None:
    return None if error is None else error.split(":", 1)[0]


GOOD = [(b"chronosMessageId", b"m-1"), (b"chronosDeadline", b"1700000000000"), (b"trace", b"\x00\x01\xfe\xff"),
        (b"dup", b"1"), (b"dup", b""), (b"nullval", None), (b"", b"empty name"), ("ünï ✓".encode(), b"x"),
        (b"n" * 300, b"v" * 70_000)]


def test_valid_names_read_as_confluent_kafka_reads_them(impl):
    expected = message_with_headers(GOOD).headers()  # the client's own conversion, on a twin message
    msg = message_with_headers(GOOD)
    assert impl.read_headers(msg) == (expected, None)
    assert impl.read_headers(msg) == (expected, None)  # reading leaves the list in place
    assert msg.headers() == expected


def test_no_headers(impl):
    assert impl.read_headers(Message(topic="t", value=b"v")) == (None, None)
    assert impl.read_headers(message_with_headers([])) == ([], None)


def test_name_not_utf8_is_escaped_and_reported(impl):
    headers, error = impl.read_headers(message_with_headers(GOOD[:3] + [(b"\xff\xfe", b"x"), (b"after", None)]))
    assert headers == [("chronosMessageId", b"m-1"), ("chronosDeadline", b"1700000000000"),
                       ("trace", b"\x00\x01\xfe\xff"), ("\\xff\\xfe", b"x"), ("after", None)]
    assert error == ("bad_header_name: header name '\\xff\\xfe' is not valid UTF-8 "
                     "(carried in this copy with its bytes escaped)")


@pytest.mark.parametrize("name, escaped", [(b"a\x00b", "a\\x00b"), (b"\x00", "\\x00"), (b"x\x00", "x\\x00"),
                                           (b"chronosDeadline\x00copy", "chronosDeadline\\x00copy"),
                                           (b"\xc3\x00\xa9", "\\xc3\\x00\\xa9")])
def test_name_with_nul_is_read_whole_escaped_and_reported(impl, name, escaped):
    headers, error = impl.read_headers(message_with_headers([(b"before", b"1"), (name, b"2"), (b"after", b"3")]))
    assert headers == [("before", b"1"), (escaped, b"2"), ("after", b"3")]
    assert code(error) == "bad_header_name" and f"'{escaped}'" in error


def test_first_bad_name_is_the_one_reported(impl):
    _, error = impl.read_headers(message_with_headers([(b"a\x00b", b"1"), (b"\xff", b"2")]))
    assert "'a\\x00b' contains NUL" in error


def test_both_implementations_agree_on_every_byte_as_a_name():
    py, native = implementation("python"), implementation("native")
    headers = [(bytes([b]) + b"x", bytes([b])) for b in range(256)] + [(b"\xe2\x82", None), (b"\xf0\x9f\x9a\x80", b"")]
    assert py.read_headers(message_with_headers(headers)) == native.read_headers(message_with_headers(headers))


def test_other_objects_are_read_with_their_headers_method(impl):
    class Fake:
        def headers(self):
            return [("a", b"1")]
    assert impl.read_headers(Fake()) == ([("a", b"1")], None)


def test_already_converted_or_replaced_headers_are_returned_as_the_message_has_them(impl):
    msg = message_with_headers([(b"a", b"1")])
    converted = msg.headers()
    assert impl.read_headers(msg) == (converted, None)
    msg = message_with_headers([(b"a", b"1")])
    msg.set_headers([("b", b"2")])
    assert impl.read_headers(msg) == ([("b", b"2")], None)


def _batch_of(*headers_lists):
    return [message_with_headers(h, topic="in") for h in headers_lists]


def test_sort_batch_dead_letters_bad_names_and_keeps_the_rest(impl, monkeypatch):
    from chronos.roles.consumer import sorting as consumer
    monkeypatch.setattr(consumer.codec, "read_headers", impl.read_headers)
    far = str(NOW_US // 1000 + 60_000).encode()
    ok = [(b"chronosMessageId", b"ok-1"), (b"chronosDeadline", far)]
    msgs = _batch_of(ok, ok[:1] + [(b"\xff\xfe", b"x")] + ok[1:],
                     [(b"chronosMessageId", b"nul"), (b"chronosDeadline", far), (b"chronosDeadline\x00copy", far)],
                     [(b"chronosMessageId", b"ok-2"), (b"chronosDeadline", far), (b"a\x00b", b"y")],
                     [(b"chronosMessageId", b"ok-3"), (b"chronosDeadline", far), (b"h", b"z")])
    batch = sort_batch(msgs, NOW_US, Rules(50_000, "out", __import__("re").compile("out")))
    assert list(batch.rows) == ["ok-1", "ok-3"]
    assert [(code(r), h) for _, r, h in batch.dead] == [
        ("bad_header_name", [("chronosMessageId", b"ok-1"), ("\\xff\\xfe", b"x"), ("chronosDeadline", far)]),
        ("bad_header_name", [("chronosMessageId", b"nul"), ("chronosDeadline", far),
                             ("chronosDeadline\\x00copy", far)]),  # not a duplicate chronosDeadline
        ("bad_header_name", [("chronosMessageId", b"ok-2"), ("chronosDeadline", far), ("a\\x00b", b"y")]),
    ]


def test_sort_batch_dead_letters_a_message_whose_headers_cannot_be_read():
    class Unreadable:
        def headers(self):
            raise SystemError("<method 'headers'> returned a result with an exception set")
        def topic(self): return "in"
        def partition(self): return 0
        def offset(self): return 7

    class Fine(Unreadable):
        def headers(self):
            return [("chronosMessageId", b"fine"), ("chronosDeadline", str(NOW_US // 1000 + 60_000).encode())]
        def key(self): return b"k"
        def value(self): return b"v"

    import re
    batch = sort_batch([Unreadable(), Fine()], NOW_US, Rules(50_000, "out", re.compile("out")))
    assert [(r, h) for _, r, h in batch.dead] == [
        ("unreadable_headers: SystemError: <method 'headers'> returned a result with an exception set", [])]
    assert list(batch.rows) == ["fine"]


LAYOUT_MISMATCH = """
import ctypes, logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from chronos.codec import implementation, librdkafka
from rdkafka_raw import message_with_headers
impl = implementation(sys.argv[1])
msg = message_with_headers([(b"a", b"1"), (b"b", None)])
hdrs = ctypes.c_void_p.from_address(id(msg) + librdkafka.C_HEADERS_OFFSET).value
name, value, size = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
librdkafka.BINDING.header_get_all(hdrs, 1, ctypes.byref(name), ctypes.byref(value), ctypes.byref(size))
ctypes.c_size_t.from_address(name.value + librdkafka.{field}).value += 1   # what another layout would show
print("first", impl.read_headers(msg))
print("next", impl.read_headers(message_with_headers([(b"c", b"3")])))
# with the raw path off, a name confluent-kafka cannot convert costs that one message only
import re
from chronos.roles.consumer import sorting as consumer
from chronos.domain.intake import Rules
consumer.codec.read_headers = impl.read_headers
consumer.codec.intake = impl.intake  # reads the headers of a run of plain messages
ok = [(b"chronosMessageId", b"ok"), (b"chronosDeadline", b"99999999999999")]
batch = consumer.sort_batch([message_with_headers([(b"\\xff", b"x")] + ok), message_with_headers(ok)], 0,
                            Rules(50_000, "out", re.compile("out")))
print("dead", [(r.split(":")[0], h) for _, r, h in batch.dead], "rows", list(batch.rows))
"""


@pytest.mark.parametrize("impl_name", ["python", "native"])
@pytest.mark.parametrize("field", ["SER_SIZE_AT", "VALUE_SIZE_AT", "NAME_SIZE_AT"])
def test_a_record_that_does_not_agree_turns_the_raw_path_off_once(impl_name, field):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    out = subprocess.run([sys.executable, "-c", LAYOUT_MISMATCH.replace("{field}", field), impl_name],
                         env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "first ([('a', b'1'), ('b', None)], None)" in out.stdout   # read with Message.headers()
    assert "next ([('c', b'3')], None)" in out.stdout
    assert out.stderr.count("ERROR reading header names through librdkafka turned off: header record 1 "
                            f"does not match rd_kafka_header_get_all's answer ({impl_name} codec)") == 1, out.stderr
    assert "dead [('unreadable_headers', [])] rows ['ok']" in out.stdout
    assert "ERROR could not read the headers of t/" in out.stderr
    assert out.stderr.count("ERROR") == 2, out.stderr
