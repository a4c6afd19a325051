"""Pure-Python implementation of the Chronos header codec.

Reference implementation: ``chronos.codec._native`` (Cython) must return exactly
the same results (including error detail texts) for every input.  Both share
``chronos.codec.types``.
"""
from __future__ import annotations

import ctypes
import enum
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from chronos.codec import librdkafka as _rd
from chronos.codec.types import (
    ACTION_CANCEL,
    ACTION_REPLACE,
    CHRONOS_HEADERS,
    COPY_COLUMNS,
    COPY_SIGNATURE,
    COPY_TRAILER,
    ERR_BAD_ACTION,
    ERR_BAD_CRON,
    ERR_BAD_DEADLINE,
    ERR_BAD_DST_POLICY,
    ERR_BAD_ID,
    ERR_BAD_ORDERING_KEY,
    ERR_BAD_TIMEZONE,
    ERR_BAD_TOPIC,
    ERR_COPY_FIELD,
    ERR_DATA_TYPE,
    ERR_DEADLINE_TYPE,
    ERR_DUPLICATE,
    ERR_EMPTY_DEADLINE,
    ERR_EMPTY_ID,
    ERR_ID_TOO_LONG,
    ERR_KEY_TYPE,
    ERR_KEY_UTF8,
    ERR_MISSING_DEADLINE,
    ERR_MISSING_ID,
    ERR_TOO_LARGE,
    ERR_TRUNCATED,
    ERR_VALUE_LENGTH,
    ERR_VALUE_TYPE,
    MAX_DEADLINE_MS,
    MAX_DEADLINE_US,
    MAX_ID_LENGTH,
    MAX_ORDERING_KEY_LENGTH,
    MAX_TOPIC_LENGTH,
    MIN_DEADLINE_US,
    POSTGRES_EPOCH_US,
    TOPIC_CHARS,
    CopyRow,
    Parsed,
    bad_header_name,
    escape_header_name,
)

__all__ = ["IMPL", "Parsed", "parse_headers", "parse_deadline", "encode_headers", "decode_headers", "read_headers",
           "copy_rows", "intake"]

IMPL = "python"

_SLOT = {name: i for i, name in enumerate(CHRONOS_HEADERS)}
_ID, _DEADLINE, _ACTION, _TOPIC, _ORDERING_KEY, _CRON, _TIMEZONE, _DST_POLICY = range(8)


class _Absent(enum.Enum):
    """A header slot no header filled (an enum member, so that `is _ABSENT` narrows the type)."""
    ABSENT = 0


_ABSENT: Final = _Absent.ABSENT
_tuple_new = tuple.__new__  # Parsed(...) goes through a Python-level __new__; this does not

# Bytes patterns: [0-9] is ASCII-only.  fullmatch() rejects anything trailing.
_ISO = re.compile(
    rb"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2})"
    rb"(?::([0-9]{2})(?:[.,]([0-9]{1,9}))?)?"
    rb"(?:[Zz]|([+-])([0-9]{2})(?::?([0-9]{2}))?)?"
)
_TOPIC_RE = re.compile(rb"[%s]{1,%d}" % (TOPIC_CHARS.encode(), MAX_TOPIC_LENGTH))

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_NULL_VALUE = _I32.pack(-1)

_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant), y >= 1."""
    if m <= 2:
        y -= 1
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def parse_deadline(value: bytes) -> int | None:
    """Parse a chronosDeadline value into microseconds since the Unix epoch (UTC).

    Accepts epoch milliseconds (1-15 ASCII digits, at most ``MAX_DEADLINE_MS``)
    or strict ISO-8601; returns ``None`` for anything else.
    """
    if not isinstance(value, bytes):
        raise TypeError(ERR_DEADLINE_TYPE % type(value).__name__)
    if len(value) <= 15 and value.isdigit():  # bytes.isdigit(): ASCII digits, non-empty
        ms = int(value)
        return ms * 1000 if ms <= MAX_DEADLINE_MS else None
    m = _ISO.fullmatch(value)
    if m is None:
        return None
    ys, mos, ds, hs, mis, ss, frac, sign, ohs, oms = m.groups()
    year = int(ys)
    month = int(mos)
    day = int(ds)
    hour = int(hs)
    minute = int(mis)
    second = int(ss) if ss is not None else 0
    if year < 1 or month < 1 or month > 12 or day < 1 or hour > 23 or minute > 59 or second > 59:
        return None
    if day > _DAYS_IN_MONTH[month]:
        if not (
            month == 2 and day == 29 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        ):
            return None
    micros = int((frac + b"00000")[:6]) if frac is not None else 0
    offset = 0
    if sign is not None:
        oh = int(ohs)
        om = int(oms) if oms is not None else 0
        if oh > 23 or om > 59:
            return None
        offset = oh * 3600 + om * 60
        if sign == b"-":
            offset = -offset
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second
    result = (seconds - offset) * 1000000 + micros
    if result < MIN_DEADLINE_US or result > MAX_DEADLINE_US:
        return None
    return result


def _text(value: bytes | None) -> str | None:
    """Non-empty strict UTF-8 text without NUL of a header value, else None."""
    if not value:  # None or b""
        return None
    if b"\x00" in value:
        return None  # PostgreSQL text cannot hold NUL
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> Parsed:
    """Split Kafka headers into the validated chronos fields and the others."""
    values: list[bytes | None | _Absent] = [_ABSENT] * 8
    others: list = []
    duplicate = None
    if headers is not None:
        slot_of = _SLOT.get
        append = others.append
        for item in headers:
            key, value = item
            slot = slot_of(key) if isinstance(key, str) else None
            if slot is None:
                append(item if type(item) is tuple else (key, value))
                continue
            if value is not None and not isinstance(value, bytes):
                raise TypeError(ERR_VALUE_TYPE % (key, type(value).__name__))
            if values[slot] is _ABSENT:
                values[slot] = value
            elif duplicate is None:
                duplicate = CHRONOS_HEADERS[slot]

    # chronosMessageId
    message_id = None
    raw = values[_ID]
    if raw is _ABSENT:
        id_error = ERR_MISSING_ID
    elif not raw:
        id_error = ERR_EMPTY_ID
    else:
        text = _text(raw)
        if text is None:
            id_error = ERR_BAD_ID
        else:
            if len(text) > MAX_ID_LENGTH:
                id_error = ERR_ID_TOO_LONG % len(text)
            else:
                id_error = None
                message_id = text

    # chronosAction
    action = None
    action_error = None
    raw = values[_ACTION]
    if raw is not _ABSENT:
        if raw == b"cancel":
            action = ACTION_CANCEL
        elif raw == b"replace":
            action = ACTION_REPLACE
        else:
            action_error = ERR_BAD_ACTION

    # chronosDeadline (optional for cancels and cron schedules)
    deadline_us = None
    deadline_error = None
    raw = values[_DEADLINE]
    if raw is _ABSENT:
        if action is not ACTION_CANCEL and values[_CRON] is _ABSENT:
            deadline_error = ERR_MISSING_DEADLINE
    elif not raw:
        deadline_error = ERR_EMPTY_DEADLINE
    else:
        deadline_us = parse_deadline(raw)
        if deadline_us is None:
            deadline_error = ERR_BAD_DEADLINE

    # chronosTopic
    topic = None
    topic_error = None
    raw = values[_TOPIC]
    if raw is not _ABSENT:
        if raw and raw != b"." and raw != b".." and _TOPIC_RE.fullmatch(raw) is not None:
            topic = raw.decode("ascii")
        else:
            topic_error = ERR_BAD_TOPIC

    # chronosOrderingKey
    ordering_key = None
    ordering_key_error = None
    raw = values[_ORDERING_KEY]
    if raw is not _ABSENT:
        ordering_key = _text(raw)
        if ordering_key is None or len(ordering_key) > MAX_ORDERING_KEY_LENGTH:
            ordering_key = None
            ordering_key_error = ERR_BAD_ORDERING_KEY

    # chronosCron / chronosTimeZone
    cron = None
    timezone = None
    cron_error = None
    raw = values[_TIMEZONE]
    if raw is not _ABSENT:
        timezone = _text(raw)
        if timezone is None:
            cron_error = ERR_BAD_TIMEZONE
    dst_policy = None
    raw = values[_DST_POLICY]
    if raw is not _ABSENT:
        dst_policy = _text(raw)
        if dst_policy is None:
            cron_error = ERR_BAD_DST_POLICY
    raw = values[_CRON]
    if raw is not _ABSENT:
        cron = _text(raw)
        if cron is None:
            cron_error = ERR_BAD_CRON

    error: str | None
    if duplicate is not None:
        error = ERR_DUPLICATE % duplicate
    else:
        error = (
            id_error
            or action_error
            or deadline_error
            or topic_error
            or ordering_key_error
            or cron_error
        )
    return _tuple_new(
        Parsed,
        (error, message_id, deadline_us, topic, ordering_key, action, cron, timezone, others, dst_policy),
    )


def encode_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> bytes:
    """Serialize headers: per header u32 key length, key UTF-8, i32 value length (-1 = None), value."""
    if headers is None:
        return b""
    parts: list[bytes] = []
    append = parts.append
    u32 = _U32.pack
    i32 = _I32.pack
    for key, value in headers:
        if not isinstance(key, str):
            raise TypeError(ERR_KEY_TYPE % type(key).__name__)
        kb = key.encode("utf-8")
        if len(kb) > 0xFFFFFFFF:
            raise ValueError(ERR_TOO_LARGE % ("key", len(kb)))
        append(u32(len(kb)))
        append(kb)
        if value is None:
            append(_NULL_VALUE)
        elif isinstance(value, bytes):
            if len(value) > 0x7FFFFFFF:
                raise ValueError(ERR_TOO_LARGE % ("value", len(value)))
            append(i32(len(value)))
            append(value)
        else:
            raise TypeError(ERR_VALUE_TYPE % (key, type(value).__name__))
    return b"".join(parts)


def decode_headers(data: bytes | bytearray | memoryview | None) -> list[tuple[str, bytes | None]]:
    """Inverse of :func:`encode_headers`; raises ValueError on corrupt data."""
    if data is None:
        return []
    if not isinstance(data, bytes):
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        else:
            raise TypeError(ERR_DATA_TYPE % type(data).__name__)
    out: list[tuple[str, bytes | None]] = []
    append = out.append
    u32 = _U32.unpack_from
    i32 = _I32.unpack_from
    n = len(data)
    pos = 0
    while pos < n:
        if n - pos < 4:
            raise ValueError(ERR_TRUNCATED % pos)
        klen = u32(data, pos)[0]
        pos += 4
        if klen > n - pos:
            raise ValueError(ERR_TRUNCATED % pos)
        try:
            key = data[pos : pos + klen].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(ERR_KEY_UTF8 % pos) from None
        pos += klen
        if n - pos < 4:
            raise ValueError(ERR_TRUNCATED % pos)
        vlen = i32(data, pos)[0]
        if vlen == -1:
            pos += 4
            append((key, None))
            continue
        if vlen < 0:
            raise ValueError(ERR_VALUE_LENGTH % (vlen, pos))
        pos += 4
        if vlen > n - pos:
            raise ValueError(ERR_TRUNCATED % pos)
        append((key, data[pos : pos + vlen]))
        pos += vlen
    return out


# --- reading a consumed message's headers (see chronos.codec.librdkafka) ---------------------

_binding = _rd.BINDING
_MESSAGE = _rd.MESSAGE
_RECORD = ctypes.c_uint64 * 4  # ser_size, value_size, name_size, value pointer


def read_headers(msg: object) -> tuple[list[tuple[str, bytes | None]] | None, str | None]:
    """A consumed message's headers, read from librdkafka's list with each name's true length.

    Returns ``(headers, error)``: ``headers`` as ``Message.headers()`` gives them (``None`` when
    there are none), except that a name that is not valid UTF-8 or holds NUL is escaped
    (`escape_header_name`) instead of breaking or cutting it; ``error`` is the ``bad_header_name``
    reason for the first such name, else ``None``. Anything but a ``confluent_kafka.Message``, and
    every message once the raw path is off, is read with ``msg.headers()``.
    """
    global _binding
    binding = _binding
    if binding is None or type(msg) is not _MESSAGE:
        return _rd.fallback(msg)
    hdrs = ctypes.c_void_p.from_address(id(msg) + _rd.C_HEADERS_OFFSET).value
    if not hdrs or ctypes.c_void_p.from_address(id(msg) + _rd.HEADERS_OFFSET).value:
        return msg.headers(), None  # type: ignore[attr-defined]  # none, or converted (or set) already
    name, value, size = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
    get_all = binding.header_get_all
    out: list[tuple[str, bytes | None]] = []
    error = None
    for i in range(binding.header_cnt(hdrs)):
        if get_all(hdrs, i, ctypes.byref(name), ctypes.byref(value), ctypes.byref(size)) != 0:
            problem = f"rd_kafka_header_get_all failed for header {i}"
            break
        at, v, n = name.value, value.value, size.value
        assert at is not None  # get_all returned 0: it set the name pointer
        ser_size, value_size, name_size, value_ptr = _RECORD.from_address(at + _rd.SER_SIZE_AT)
        if not _rd.record_agrees(ser_size, value_size, name_size, value_ptr or None, at, v, n) \
                or ctypes.string_at(at + name_size, 1) != b"\x00":
            problem = f"header record {i} does not match rd_kafka_header_get_all's answer"
            break
        raw = ctypes.string_at(at, name_size)
        try:
            if b"\x00" in raw:
                raise ValueError
            key = raw.decode("utf-8")
        except ValueError:  # UnicodeDecodeError included
            key = escape_header_name(raw)
            if error is None:
                error = bad_header_name(raw)
        out.append((key, None if v is None else ctypes.string_at(v, n)))
    else:
        return out, error
    _binding = None
    _rd.disable(f"{problem} (python codec)")
    return _rd.fallback(msg)


# --- PostgreSQL binary COPY of the consumer's rows ----------------------------------------------

_FIELD_COUNT = struct.Struct(">h").pack(len(COPY_COLUMNS))
_FIELD_COUNT_BEFORE_PARTITION = struct.Struct(">h").pack(len(COPY_COLUMNS) - 1)
_NULL_FIELD = _I32.pack(-1)
_TIMESTAMP = struct.Struct(">iq").pack
_INT4 = struct.Struct(">ii").pack
_PARTITION = COPY_COLUMNS.index("input_partition")


def _copy_value(value: object, column: int, row: int) -> bytes:
    """One field of a row: its length and its bytes (text as UTF-8, bytea as it is), or NULL."""
    if value is None:
        if column < 2:  # id and deadline_us
            raise TypeError(ERR_COPY_FIELD % (row, COPY_COLUMNS[column], "None"))
        return _NULL_FIELD
    if column == 1:
        if not isinstance(value, int):
            raise TypeError(ERR_COPY_FIELD % (row, COPY_COLUMNS[column], type(value).__name__))
        return _TIMESTAMP(8, value - POSTGRES_EPOCH_US)
    if column == _PARTITION:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0x7FFFFFFF:
            raise TypeError(ERR_COPY_FIELD % (row, COPY_COLUMNS[column], type(value).__name__))
        return _INT4(4, value)
    if column in (3, 4, 5):
        if not isinstance(value, bytes):
            raise TypeError(ERR_COPY_FIELD % (row, COPY_COLUMNS[column], type(value).__name__))
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8")
    else:
        raise TypeError(ERR_COPY_FIELD % (row, COPY_COLUMNS[column], type(value).__name__))
    if len(data) > 0x7FFFFFFF:
        raise ValueError(ERR_TOO_LARGE % (COPY_COLUMNS[column], len(data)))
    return _I32.pack(len(data)) + data


def copy_rows(rows: Iterable[CopyRow], input_partition: bool = True) -> bytes:
    """Rows as one PostgreSQL binary COPY stream (signature, one tuple per row, trailer) of the
    columns COPY_COLUMNS: text, timestamptz (from epoch microseconds), bytea, integer; without the
    last, `input_partition`, when not `input_partition` (a schema before it)."""
    parts = [COPY_SIGNATURE]
    append = parts.append
    count = _FIELD_COUNT if input_partition else _FIELD_COUNT_BEFORE_PARTITION
    for i, r in enumerate(rows):
        append(count)
        for column, value in enumerate((r.id, r.deadline_us, r.topic, r.key, r.value, r.headers, r.ordering_key,
                                        r.cron, r.timezone, r.dst_policy)):
            append(_copy_value(value, column, i))
        if input_partition:
            append(_copy_value(r.input_partition, _PARTITION, i))
    append(COPY_TRAILER)
    return b"".join(parts)


# --- the consumer's intake of plain messages ----------------------------------------------------

def intake(messages: Sequence[Any], start: int, now_us: int, timing_advance_us: int, max_lateness_us: int | None,
           output_topic: str, batch: Any, make_row: Callable[..., Any],
           insert_op: str) -> tuple[int, tuple[Any, str | None] | Exception | None]:
    """Sort the plain messages of a poll from ``messages[start]`` on into ``batch``; return the index
    of the first message left to the caller (``len(messages)`` when none is) and what read_headers
    gave for it (or raised): a message's headers are read once, since confluent-kafka's own
    conversion must not be asked again after it failed.

    A plain message has readable headers and valid Chronos headers with neither action nor
    recurrence, and goes to the output topic: it is published now (late) or stored. It is decided
    and added to ``batch.ops`` (``id -> (insert_op, make_row(id, deadline_us, topic, key, value,
    encoded headers, ordering key, input partition))``), ``batch.sources`` (``id -> message``),
    ``batch.late`` (``(message, parsed)``) or counted in ``batch.duplicates`` exactly as
    chronos.domain.intake.decide and the consumer's sort_batch would. The first message that is not
    plain (or whose id an earlier cancel in ``batch.ops`` makes a replace) ends the run, and so
    does one past ``max_lateness_us``: the caller sorts that one itself.
    """
    ops, sources, late = batch.ops, batch.sources, batch.late
    duplicates = 0
    left: tuple[Any, str | None] | Exception | None = None
    i, n = start, len(messages)
    try:
        while i < n:
            msg = messages[i]
            try:
                headers, bad_name = read_headers(msg)
            except Exception as exc:  # noqa: BLE001 - the caller dead-letters it with the reason
                left = exc
                break
            left = (headers, bad_name)
            if bad_name is not None:
                break
            parsed = parse_headers(headers)
            if parsed.error is not None or parsed.action is not None or parsed.cron is not None \
                    or parsed.timezone is not None or parsed.dst_policy is not None:
                break
            topic = parsed.topic
            if topic is not None:
                if topic != output_topic:
                    break
                topic = None
            deadline = parsed.deadline_us
            assert deadline is not None  # valid, with neither cancel nor recurrence
            if max_lateness_us is not None and now_us - deadline > max_lateness_us:
                break
            mid = parsed.message_id
            previous = ops.get(mid)
            if deadline <= now_us + timing_advance_us:  # late: published now, unless its id waits
                if previous is not None and previous[1] is not None:
                    duplicates += 1
                else:
                    late.append((msg, parsed))
            elif previous is not None:
                if previous[1] is None:  # cancelled earlier in the batch: a replace
                    break
                duplicates += 1
            else:
                ops[mid] = (insert_op, make_row(mid, deadline, topic, msg.key(), msg.value(),
                                                encode_headers(parsed.headers), parsed.ordering_key, msg.partition()))
                sources[mid] = msg
            i += 1
    finally:
        if duplicates:
            batch.duplicates += duplicates
    return i, (left if i < n else None)
