"""The headers librdkafka parsed for a consumed message, read without confluent-kafka's conversion.

confluent-kafka's ``Message.headers()`` makes each header name a ``str`` with
``PyUnicode_FromString``: a name that is not UTF-8 makes it raise ``SystemError`` and leaves a
list with a NULL item behind (touching it later crashes the interpreter), and a name with a NUL
byte is cut at the NUL. Until ``headers()`` is first called, a consumed ``Message`` keeps the
``rd_kafka_headers_t`` librdkafka parsed (its ``c_headers`` field), so both codec
implementations read that list through librdkafka's own API instead (``read_headers``).

librdkafka returns a header's name as a NUL-terminated pointer without its length. Its header
record (``rd_kafka_header_t``, unchanged since librdkafka 0.11.4) is::

    size_t rkhdr_ser_size;    name - 32   name_size + value_size + varint lengths of both
    size_t rkhdr_value_size;  name - 24   == the size rd_kafka_header_get_all returns
    size_t rkhdr_name_size;   name - 16   the name's true length
    char  *rkhdr_value;       name - 8    == the value rd_kafka_header_get_all returns
    char   rkhdr_name[];      name        NUL-terminated, the value (if any) right after it

The readers take the true length from ``rkhdr_name_size`` only when every other field agrees
with what the public API returned (`record_agrees`); otherwise they turn the raw path off for
the rest of the process, log it once, and read that message's headers with ``headers()``.
This module finds the library and checks the ``Message`` layout once, at import.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger("chronos.codec")

# confluent_kafka.Message: PyObject_HEAD; PyObject *topic, *value, *key, *headers;
# rd_kafka_headers_t *c_headers; ... (checked below by `_check_message_layout`).
HEADERS_OFFSET = 40
C_HEADERS_OFFSET = 48
# rd_kafka_header_t fields, as offsets from rkhdr_name (64-bit; see the module docstring).
SER_SIZE_AT, VALUE_SIZE_AT, NAME_SIZE_AT, VALUE_PTR_AT = -32, -24, -16, -8
# A name longer than this is taken for a misread record, not a header (Kafka frames are < 2 GiB).
MAX_NAME_SIZE = 0x7FFFFFFF


def varint_size(n: int) -> int:
    """Bytes librdkafka's zig-zag varint takes for the non-negative size `n`."""
    n <<= 1
    size = 1
    while n > 0x7F:
        n >>= 7
        size += 1
    return size


def record_agrees(ser_size: int, value_size: int, name_size: int, value_ptr: int | None,
                  name: int, value: int | None, size: int) -> bool:
    """Whether a header record read at `name` (its fields as integers) matches what
    rd_kafka_header_get_all returned (`value`, `size`). Needs nothing dereferenced past the
    record, so it runs before the name's bytes are read."""
    return (value_ptr == value and value_size == size and name_size <= MAX_NAME_SIZE
            and ser_size == name_size + size + varint_size(name_size) + varint_size(size)
            and (value is None or value == name + name_size + 1))


class Binding:
    """The loaded librdkafka and the two functions the readers call."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.path = path
        self.header_cnt = lib.rd_kafka_header_cnt
        self.header_cnt.argtypes = [ctypes.c_void_p]
        self.header_cnt.restype = ctypes.c_size_t
        self.header_get_all = lib.rd_kafka_header_get_all
        self.header_get_all.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        self.header_get_all.restype = ctypes.c_int
        #: C function addresses, for the Cython reader.
        self.header_cnt_address = ctypes.cast(self.header_cnt, ctypes.c_void_p).value
        self.header_get_all_address = ctypes.cast(self.header_get_all, ctypes.c_void_p).value


def _library_path(cimpl_file: str) -> str:
    """The librdkafka confluent_kafka.cimpl runs on: the one mapped into this process, else the copy
    bundled with the wheel."""
    try:
        with open("/proc/self/maps") as maps:
            mapped = {parts[5].strip() for parts in (line.split(None, 5) for line in maps if "librdkafka" in line)
                      if len(parts) == 6}
    except OSError:
        mapped = set()
    mapped = {p for p in mapped if os.path.basename(p).startswith("librdkafka")}
    if len(mapped) == 1:
        return mapped.pop()
    if len(mapped) > 1:
        raise RuntimeError(f"several librdkafka libraries are loaded: {sorted(mapped)}")
    libs = os.path.join(os.path.dirname(os.path.dirname(cimpl_file)), "confluent_kafka.libs")
    found = sorted(f for f in os.listdir(libs) if f.startswith("librdkafka")) if os.path.isdir(libs) else []
    if len(found) != 1:
        raise RuntimeError(f"librdkafka not found beside confluent_kafka (in {libs}: {found})")
    return os.path.join(libs, found[0])


def _check_message_layout(message_type: type) -> None:
    """A Message built from Python must show its fields where the readers look for them."""
    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8 \
            or ctypes.sizeof(ctypes.c_size_t) != 8 or object.__basicsize__ != 16:
        raise RuntimeError("needs 64-bit CPython")
    if message_type.__basicsize__ < C_HEADERS_OFFSET + 8:
        raise RuntimeError(f"confluent_kafka.Message is {message_type.__basicsize__} bytes")
    fields = ("topic", b"value", b"key", [("h", b"v")])
    msg = message_type(topic=fields[0], value=fields[1], key=fields[2], headers=fields[3])
    seen = [ctypes.c_void_p.from_address(id(msg) + 16 + 8 * i).value for i in range(5)]
    if seen != [id(f) for f in fields] + [None]:
        raise RuntimeError("confluent_kafka.Message fields are not where they are expected "
                           "(topic, value, key, headers, c_headers)")


def _load() -> tuple[Binding | None, type | None, str | None]:
    try:
        import confluent_kafka
        from confluent_kafka import cimpl
        major = int(confluent_kafka.version()[0].split(".")[0])
        if major != 2:
            raise RuntimeError(f"confluent-kafka {confluent_kafka.version()[0]} is not a 2.x release")
        _check_message_layout(confluent_kafka.Message)
        path = _library_path(cimpl.__file__)
        lib = ctypes.CDLL(path)
        lib.rd_kafka_version.restype = ctypes.c_int
        if lib.rd_kafka_version() != confluent_kafka.libversion()[1]:
            raise RuntimeError(f"{path} is version {lib.rd_kafka_version():#x}, confluent-kafka runs on "
                               f"{confluent_kafka.libversion()[1]:#x}")
        return Binding(lib, path), confluent_kafka.Message, None
    except Exception as exc:  # noqa: BLE001 - any failure means: read headers through Message.headers()
        return None, None, f"{type(exc).__name__}: {exc}"


#: The binding, the Message type, or why the raw path is off (None when it is on).
BINDING, MESSAGE, PROBLEM = _load()
_reported = False


def disable(problem: str) -> None:
    """A reader found a header record that does not agree: log it (the readers stop using the
    raw path themselves)."""
    global PROBLEM, _reported
    PROBLEM, _reported = problem, True
    log.error("reading header names through librdkafka turned off: %s; headers are read with "
              "confluent-kafka's Message.headers() from now on", problem)


def fallback(msg: object) -> tuple[list | None, None]:
    """``msg.headers()``, for a message the raw path cannot read. An exception from it (a name that
    is not UTF-8) reaches the caller, which must not call ``headers()`` on that message again."""
    global _reported
    if not _reported and PROBLEM is not None and MESSAGE is not None and type(msg) is MESSAGE:
        _reported = True
        log.error("header names are read with confluent-kafka's Message.headers() (%s): a message with a "
                  "header name that is not UTF-8 is dead-lettered without its headers, and a name with NUL "
                  "is cut at the NUL", PROBLEM)
    return msg.headers(), None  # type: ignore[attr-defined]
