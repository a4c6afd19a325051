# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Native (Cython) implementation of the Chronos header codec.

Must return exactly what the pure-Python reference ``chronos.codec._python``
returns for every input (same ``Parsed``, same error/detail texts, same
exception types and messages).  All shared texts and constants come from
``chronos.codec.types``; the byte-level work (key matching, deadline parsing,
topic validation, storage encoding) happens in typed C loops.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_DECREF
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport (
    PyUnicode_AsUTF8AndSize,
    PyUnicode_Check,
    PyUnicode_DATA,
    PyUnicode_DecodeASCII,
    PyUnicode_GET_LENGTH,
)
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memchr, memcmp, memcpy

from chronos.codec import librdkafka as _rd
from chronos.codec import types as _types
from chronos.codec.types import (
    ERR_BAD_ACTION,
    ERR_BAD_CRON,
    ERR_BAD_DEADLINE,
    ERR_BAD_DST_POLICY,
    ERR_BAD_ID,
    ERR_BAD_ORDERING_KEY,
    ERR_BAD_TIMEZONE,
    ERR_BAD_TOPIC,
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
    Parsed,
    bad_header_name,
    escape_header_name,
)

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    # Raw variant (NULL on error, no automatic raise) so the hot paths need no try/except.
    PyObject* _decode_utf8_raw "PyUnicode_DecodeUTF8" (const char* s, Py_ssize_t size, const char* errors)
    int PyErr_ExceptionMatches(object exc)
    void PyErr_Clear()
    PyObject* PyErr_Occurred_ptr "PyErr_Occurred" ()

__all__ = ["IMPL", "Parsed", "parse_headers", "parse_deadline", "encode_headers", "decode_headers", "read_headers",
           "copy_rows", "intake"]

IMPL = "native"

# Slots (must match the order of types.CHRONOS_HEADERS, checked below).
cdef enum:
    S_ID = 0
    S_DEADLINE = 1
    S_ACTION = 2
    S_TOPIC = 3
    S_ORDERING_KEY = 4
    S_CRON = 5
    S_TIMEZONE = 6
    S_DST_POLICY = 7

if _types.CHRONOS_HEADERS != (
    "chronosMessageId", "chronosDeadline", "chronosAction", "chronosTopic",
    "chronosOrderingKey", "chronosCron", "chronosTimeZone", "chronosDstPolicy",
):
    raise ImportError("chronos.codec.types.CHRONOS_HEADERS changed; rebuild the native codec")

# Limits are compiled in; verified against types.py at import time.
cdef int64_t C_MAX_DEADLINE_MS = 253402300799999
cdef int64_t C_MIN_DEADLINE_US = -62135596800000000
cdef int64_t C_MAX_DEADLINE_US = 253402300799999999
cdef Py_ssize_t C_MAX_ID_LENGTH = 128
cdef Py_ssize_t C_MAX_TOPIC_LENGTH = 249
cdef Py_ssize_t C_MAX_ORDERING_KEY_LENGTH = 256
if (
    _types.MAX_DEADLINE_MS != C_MAX_DEADLINE_MS
    or _types.MIN_DEADLINE_US != C_MIN_DEADLINE_US
    or _types.MAX_DEADLINE_US != C_MAX_DEADLINE_US
    or _types.MAX_ID_LENGTH != C_MAX_ID_LENGTH
    or _types.MAX_TOPIC_LENGTH != C_MAX_TOPIC_LENGTH
    or _types.MAX_ORDERING_KEY_LENGTH != C_MAX_ORDERING_KEY_LENGTH
):
    raise ImportError("chronos.codec.types limits changed; rebuild the native codec")

cdef tuple HEADER_NAMES = _types.CHRONOS_HEADERS
cdef dict SLOT_OF = {name: i for i, name in enumerate(_types.CHRONOS_HEADERS)}
cdef object ACTION_CANCEL = _types.ACTION_CANCEL
cdef object ACTION_REPLACE = _types.ACTION_REPLACE
cdef type PARSED = Parsed
# tuple's tp_new slot, called as tuple.__new__(Parsed, items) without the
# Python-level wrapper (Parsed's own __new__ is a slow Python function).
cdef PyTypeObject* TUPLE_TYPE = <PyTypeObject*>tuple
if not issubclass(Parsed, tuple) or Parsed.__new__ is tuple.__new__:
    raise ImportError("chronos.codec.types.Parsed must be a NamedTuple")


cdef inline object _make_parsed(tuple items):
    cdef tuple args = (items,)
    return TUPLE_TYPE.tp_new(PARSED, <PyObject*>args, NULL)

# Topic characters [A-Za-z0-9._-].
cdef unsigned char TOPIC_OK[256]
cdef int _c
for _c in range(256):
    TOPIC_OK[_c] = (
        (48 <= _c <= 57) or (65 <= _c <= 90) or (97 <= _c <= 122) or _c == 46 or _c == 95 or _c == 45
    )

cdef int64_t POW10[7]
POW10[:] = [1, 10, 100, 1000, 10000, 100000, 1000000]

cdef unsigned char DAYS_IN_MONTH[16]
DAYS_IN_MONTH[:] = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31, 0, 0, 0]


# --------------------------------------------------------------------------
# Deadline parsing (pure C)
# --------------------------------------------------------------------------

cdef inline int _d2(const unsigned char* p) noexcept nogil:
    """Two ASCII digits -> 0..99, or -1."""
    cdef unsigned int a = <unsigned int>p[0] - 48u
    cdef unsigned int b = <unsigned int>p[1] - 48u
    if a > 9u or b > 9u:
        return -1
    return <int>(a * 10u + b)


cdef inline int64_t _days_from_civil(int64_t y, int64_t m, int64_t d) noexcept nogil:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant); y >= 1."""
    cdef int64_t era, yoe, doy, doe
    if m <= 2:
        y -= 1
    era = y // 400  # y >= 0 here, so C division == floor division
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


cdef bint _parse_deadline_c(const unsigned char* s, Py_ssize_t n, int64_t* out) noexcept nogil:
    """Parse epoch-ms digits or strict ISO-8601 into epoch microseconds; False if invalid."""
    cdef Py_ssize_t i, pos, k
    cdef int64_t v, us, off, total
    cdef int year, month, day, hour, minute, second, oh, om, hi, lo, dim
    cdef unsigned char c

    if n <= 0:
        return False
    # 1. epoch milliseconds: 1..15 ASCII digits
    if n <= 15:
        v = 0
        for i in range(n):
            c = s[i]
            if c < 48 or c > 57:
                break
            v = v * 10 + (c - 48)
        else:
            if v > C_MAX_DEADLINE_MS:
                return False
            out[0] = v * 1000
            return True
    # 2. ISO-8601: YYYY-MM-DD[Tt ]HH:MM[:SS[(.|,)F{1,9}]][Z|z|(+|-)HH[[:]MM]]
    if n < 16:
        return False
    hi = _d2(s)
    lo = _d2(s + 2)
    if hi < 0 or lo < 0:
        return False
    year = hi * 100 + lo
    if s[4] != c'-' or s[7] != c'-' or s[13] != c':':
        return False
    c = s[10]
    if c != c'T' and c != c't' and c != c' ':
        return False
    month = _d2(s + 5)
    day = _d2(s + 8)
    hour = _d2(s + 11)
    minute = _d2(s + 14)
    if year < 1 or month < 1 or month > 12 or day < 1 or hour < 0 or hour > 23 or minute < 0 or minute > 59:
        return False
    dim = DAYS_IN_MONTH[month]
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        dim = 29
    if day > dim:
        return False

    pos = 16
    second = 0
    us = 0
    if pos < n and s[pos] == c':':
        if n - pos < 3:
            return False
        second = _d2(s + pos + 1)
        if second < 0 or second > 59:
            return False
        pos += 3
        if pos < n and (s[pos] == c'.' or s[pos] == c','):
            pos += 1
            k = 0
            while k < 9 and pos + k < n:
                c = s[pos + k]
                if c < 48 or c > 57:
                    break
                if k < 6:
                    us = us * 10 + (c - 48)
                k += 1
            if k == 0:
                return False
            if k < 6:
                us *= POW10[6 - k]
            pos += k

    off = 0
    if pos < n:
        c = s[pos]
        if c == c'Z' or c == c'z':
            if pos + 1 != n:
                return False
        elif c == c'+' or c == c'-':
            k = n - pos - 1
            if k == 2:
                oh = _d2(s + pos + 1)
                om = 0
            elif k == 4:
                oh = _d2(s + pos + 1)
                om = _d2(s + pos + 3)
            elif k == 5 and s[pos + 3] == c':':
                oh = _d2(s + pos + 1)
                om = _d2(s + pos + 4)
            else:
                return False
            if oh < 0 or om < 0 or oh > 23 or om > 59:
                return False
            off = oh * 3600 + om * 60
            if c == c'-':
                off = -off
        else:
            return False

    total = (
        _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - off
    ) * 1000000 + us
    if total < C_MIN_DEADLINE_US or total > C_MAX_DEADLINE_US:
        return False
    out[0] = total
    return True


def parse_deadline(value):
    """Parse a chronosDeadline value (bytes) into epoch microseconds (UTC), or None."""
    cdef int64_t us
    if not PyBytes_Check(value):
        raise TypeError(ERR_DEADLINE_TYPE % type(value).__name__)
    if _parse_deadline_c(<const unsigned char*>PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), &us):
        return us
    return None


# --------------------------------------------------------------------------
# Header parsing
# --------------------------------------------------------------------------

cdef int _slot(object key) except -2:
    """Chronos slot of a header key, or -1 for any other key."""
    if not PyUnicode_Check(key):
        return -1
    if not PyUnicode_IS_COMPACT_ASCII(key):
        # Non-ASCII (can never match) or a legacy string: exact dict semantics.
        return SLOT_OF.get(key, -1)
    return _slot_raw(<const char*>PyUnicode_DATA(key), PyUnicode_GET_LENGTH(key))


cdef int _slot_raw(const char* p, Py_ssize_t n) noexcept nogil:
    """Chronos slot of the ASCII header name p[:n], or -1 for any other name."""
    if n < 11 or n > 18:
        return -1
    if memcmp(p, b"chronos", 7) != 0:
        return -1
    p += 7
    n -= 7
    if n == 9:
        if memcmp(p, b"MessageId", 9) == 0:
            return S_ID
        if memcmp(p, b"DstPolicy", 9) == 0:
            return S_DST_POLICY
    elif n == 8:
        if memcmp(p, b"Deadline", 8) == 0:
            return S_DEADLINE
        if memcmp(p, b"TimeZone", 8) == 0:
            return S_TIMEZONE
    elif n == 6:
        if memcmp(p, b"Action", 6) == 0:
            return S_ACTION
    elif n == 5:
        if memcmp(p, b"Topic", 5) == 0:
            return S_TOPIC
    elif n == 11:
        if memcmp(p, b"OrderingKey", 11) == 0:
            return S_ORDERING_KEY
    elif n == 4:
        if memcmp(p, b"Cron", 4) == 0:
            return S_CRON
    return -1


cdef int _propagate() except -1:
    """Propagate the exception already set in the interpreter."""
    return -1


cdef object _utf8_or_none(const char* s, Py_ssize_t n):
    """Strict UTF-8 text of s[:n] (same codec as bytes.decode), or None if invalid.

    Any exception other than UnicodeDecodeError (e.g. MemoryError) propagates.
    """
    cdef PyObject* res = _decode_utf8_raw(s, n, NULL)
    if res is NULL:
        if PyErr_ExceptionMatches(UnicodeDecodeError):
            PyErr_Clear()
            return None
        _propagate()
    obj = <object>res  # takes a second reference ...
    Py_DECREF(obj)  # ... so drop the one returned by PyUnicode_DecodeUTF8
    return obj


cdef inline object _utf8(object value):
    """Strict UTF-8 text without NUL (PostgreSQL text cannot hold it), or None."""
    cdef const char* s = PyBytes_AS_STRING(value)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(value)
    if memchr(s, 0, n) != NULL:
        return None
    return _utf8_or_none(s, n)


cdef inline bint _empty(object value):
    return value is None or PyBytes_GET_SIZE(value) == 0


def parse_headers(headers):
    """Split Kafka headers into the validated chronos fields and the others."""
    cdef list seq
    cdef list others = []
    cdef Py_ssize_t i, n
    cdef int slot, present = 0, duplicate = -1
    cdef object item, key, value, text
    cdef object v_id = None, v_deadline = None, v_action = None, v_topic = None
    cdef object v_okey = None, v_cron = None, v_tz = None, v_dst = None
    cdef object error, id_error = None, action_error = None, deadline_error = None
    cdef object topic_error = None, okey_error = None, cron_error = None
    cdef object message_id = None, deadline_us = None, topic = None, ordering_key = None
    cdef object action = None, cron = None, timezone = None, dst_policy = None
    cdef const unsigned char* p
    cdef int64_t us

    if headers is not None:
        seq = <list>headers if type(headers) is list else list(headers)
        i = 0
        while i < PyList_GET_SIZE(seq):
            item = <object>PyList_GET_ITEM(seq, i)
            i += 1
            if PyTuple_CheckExact(item) and PyTuple_GET_SIZE(item) == 2:
                key = <object>PyTuple_GET_ITEM(item, 0)
                value = <object>PyTuple_GET_ITEM(item, 1)
            else:
                key, value = item
                item = (key, value)
            slot = _slot(key)
            if slot < 0:
                others.append(item)
                continue
            if value is not None and not PyBytes_Check(value):
                raise TypeError(ERR_VALUE_TYPE % (key, type(value).__name__))
            if present & (1 << slot):
                if duplicate < 0:
                    duplicate = slot
                continue
            present |= 1 << slot
            if slot == S_ID:
                v_id = value
            elif slot == S_DEADLINE:
                v_deadline = value
            elif slot == S_ACTION:
                v_action = value
            elif slot == S_TOPIC:
                v_topic = value
            elif slot == S_ORDERING_KEY:
                v_okey = value
            elif slot == S_CRON:
                v_cron = value
            elif slot == S_TIMEZONE:
                v_tz = value
            else:
                v_dst = value

    # chronosMessageId
    if not present & (1 << S_ID):
        id_error = ERR_MISSING_ID
    elif _empty(v_id):
        id_error = ERR_EMPTY_ID
    else:
        text = _utf8(v_id)
        if text is None:
            id_error = ERR_BAD_ID
        elif PyUnicode_GET_LENGTH(text) > C_MAX_ID_LENGTH:
            id_error = ERR_ID_TOO_LONG % PyUnicode_GET_LENGTH(text)
        else:
            message_id = text

    # chronosAction
    if present & (1 << S_ACTION):
        if v_action is not None:
            n = PyBytes_GET_SIZE(v_action)
            p = <const unsigned char*>PyBytes_AS_STRING(v_action)
            if n == 6 and memcmp(p, b"cancel", 6) == 0:
                action = ACTION_CANCEL
            elif n == 7 and memcmp(p, b"replace", 7) == 0:
                action = ACTION_REPLACE
        if action is None:
            action_error = ERR_BAD_ACTION

    # chronosDeadline (optional for cancels and cron schedules)
    if not present & (1 << S_DEADLINE):
        if action is not ACTION_CANCEL and not present & (1 << S_CRON):
            deadline_error = ERR_MISSING_DEADLINE
    elif _empty(v_deadline):
        deadline_error = ERR_EMPTY_DEADLINE
    elif _parse_deadline_c(
        <const unsigned char*>PyBytes_AS_STRING(v_deadline), PyBytes_GET_SIZE(v_deadline), &us
    ):
        deadline_us = us
    else:
        deadline_error = ERR_BAD_DEADLINE

    # chronosTopic
    if present & (1 << S_TOPIC):
        topic_error = ERR_BAD_TOPIC
        if v_topic is not None:
            n = PyBytes_GET_SIZE(v_topic)
            p = <const unsigned char*>PyBytes_AS_STRING(v_topic)
            if 0 < n <= C_MAX_TOPIC_LENGTH and not (p[0] == c'.' and (n == 1 or (n == 2 and p[1] == c'.'))):
                i = 0
                while i < n and TOPIC_OK[p[i]]:
                    i += 1
                if i == n:
                    topic = PyUnicode_DecodeASCII(<const char*>p, n, NULL)
                    topic_error = None

    # chronosOrderingKey
    if present & (1 << S_ORDERING_KEY):
        if not _empty(v_okey):
            ordering_key = _utf8(v_okey)
            if ordering_key is not None and PyUnicode_GET_LENGTH(ordering_key) > C_MAX_ORDERING_KEY_LENGTH:
                ordering_key = None
        if ordering_key is None:
            okey_error = ERR_BAD_ORDERING_KEY

    # chronosCron / chronosTimeZone (cron reported first)
    if present & (1 << S_TIMEZONE):
        if not _empty(v_tz):
            timezone = _utf8(v_tz)
        if timezone is None:
            cron_error = ERR_BAD_TIMEZONE
    if present & (1 << S_DST_POLICY):
        if not _empty(v_dst):
            dst_policy = _utf8(v_dst)
        if dst_policy is None:
            cron_error = ERR_BAD_DST_POLICY
    if present & (1 << S_CRON):
        if not _empty(v_cron):
            cron = _utf8(v_cron)
        if cron is None:
            cron_error = ERR_BAD_CRON

    if duplicate >= 0:
        error = ERR_DUPLICATE % HEADER_NAMES[duplicate]
    elif id_error is not None:
        error = id_error
    elif action_error is not None:
        error = action_error
    elif deadline_error is not None:
        error = deadline_error
    elif topic_error is not None:
        error = topic_error
    elif okey_error is not None:
        error = okey_error
    else:
        error = cron_error
    return _make_parsed(
        (error, message_id, deadline_us, topic, ordering_key, action, cron, timezone, others, dst_policy)
    )


# --------------------------------------------------------------------------
# Storage encoding
# --------------------------------------------------------------------------

cdef inline void _put_u32(unsigned char* w, uint32_t v) noexcept nogil:
    w[0] = <unsigned char>(v >> 24)
    w[1] = <unsigned char>(v >> 16)
    w[2] = <unsigned char>(v >> 8)
    w[3] = <unsigned char>v


cdef inline Py_ssize_t _put_header(unsigned char* w, const char* name, Py_ssize_t name_size, const void* value,
                                   Py_ssize_t value_size) noexcept nogil:
    """Write one header in the storage encoding at `w` (u32 name length, name, i32 value length or -1
    for no value, value); return the bytes written. The caller sized the buffer."""
    _put_u32(w, <uint32_t>name_size)
    memcpy(w + 4, name, name_size)
    w += 4 + name_size
    if value == NULL:
        _put_u32(w, <uint32_t><int32_t>-1)
        return 8 + name_size
    _put_u32(w, <uint32_t>value_size)
    memcpy(w + 4, value, value_size)
    return 8 + name_size + value_size


cdef inline uint32_t _get_u32(const unsigned char* r) noexcept nogil:
    return (<uint32_t>r[0] << 24) | (<uint32_t>r[1] << 16) | (<uint32_t>r[2] << 8) | <uint32_t>r[3]


def encode_headers(headers):
    """Serialize headers: per header u32 key length, key UTF-8, i32 value length (-1 = None), value."""
    cdef list seq
    cdef list norm = None
    cdef Py_ssize_t i, n, klen, vlen, total = 0, pos = 0
    cdef const char* kp
    cdef object item, key, value
    cdef bytes out
    cdef unsigned char* w

    if headers is None:
        return b""
    seq = <list>headers if type(headers) is list else list(headers)
    n = PyList_GET_SIZE(seq)
    # Pass 1: validate (in order, like the Python codec) and compute the size.
    for i in range(n):
        item = <object>PyList_GET_ITEM(seq, i)
        if PyTuple_CheckExact(item) and PyTuple_GET_SIZE(item) == 2:
            key = <object>PyTuple_GET_ITEM(item, 0)
            value = <object>PyTuple_GET_ITEM(item, 1)
        else:
            key, value = item
            if norm is None:
                norm = seq[:i]  # snapshot: pass 2 must only see exact 2-tuples we own
            item = (key, value)
        if norm is not None:
            norm.append(item)
        if not PyUnicode_Check(key):
            raise TypeError(ERR_KEY_TYPE % type(key).__name__)
        PyUnicode_AsUTF8AndSize(key, &klen)
        if klen > 0xFFFFFFFF:
            raise ValueError(ERR_TOO_LARGE % ("key", klen))
        if value is None:
            vlen = 0
        elif PyBytes_Check(value):
            vlen = PyBytes_GET_SIZE(value)
            if vlen > 0x7FFFFFFF:
                raise ValueError(ERR_TOO_LARGE % ("value", vlen))
        else:
            raise TypeError(ERR_VALUE_TYPE % (key, type(value).__name__))
        total += 8 + klen + vlen
    if norm is not None:
        seq = norm
        n = PyList_GET_SIZE(seq)
    if total == 0:
        return b""

    # Pass 2: copy (no Python code runs between the passes).
    out = PyBytes_FromStringAndSize(NULL, total)
    w = <unsigned char*>PyBytes_AS_STRING(out)
    if PyList_GET_SIZE(seq) != n:
        raise RuntimeError("header list changed while encoding")
    for i in range(n):
        item = <object>PyList_GET_ITEM(seq, i)
        # Re-checked (cheap) rather than trusted, so a list mutated from another
        # thread can only cause a RuntimeError, never memory corruption.
        if not (PyTuple_CheckExact(item) and PyTuple_GET_SIZE(item) == 2):
            raise RuntimeError("header list changed while encoding")
        key = <object>PyTuple_GET_ITEM(item, 0)
        value = <object>PyTuple_GET_ITEM(item, 1)
        if not PyUnicode_Check(key) or not (value is None or PyBytes_Check(value)):
            raise RuntimeError("header list changed while encoding")
        kp = PyUnicode_AsUTF8AndSize(key, &klen)
        vlen = -1 if value is None else PyBytes_GET_SIZE(value)
        if pos + 8 + klen + (vlen if vlen > 0 else 0) > total:
            raise RuntimeError("header list changed while encoding")
        pos += _put_header(w + pos, kp, klen, NULL if value is None else <const void*>PyBytes_AS_STRING(value),
                           0 if value is None else vlen)
    if pos != total:
        raise RuntimeError("header list changed while encoding")
    return out


def decode_headers(data):
    """Inverse of encode_headers; raises ValueError on corrupt data."""
    cdef const unsigned char* r
    cdef Py_ssize_t n, pos = 0, klen
    cdef int32_t vlen
    cdef list out = []
    cdef object key, value

    if data is None:
        return out
    if not PyBytes_Check(data):
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        else:
            raise TypeError(ERR_DATA_TYPE % type(data).__name__)
    r = <const unsigned char*>PyBytes_AS_STRING(data)
    n = PyBytes_GET_SIZE(data)
    while pos < n:
        if n - pos < 4:
            raise ValueError(ERR_TRUNCATED % pos)
        klen = <Py_ssize_t>_get_u32(r + pos)
        pos += 4
        if klen > n - pos:
            raise ValueError(ERR_TRUNCATED % pos)
        key = _utf8_or_none(<const char*>(r + pos), klen)
        if key is None:
            raise ValueError(ERR_KEY_UTF8 % pos)
        pos += klen
        if n - pos < 4:
            raise ValueError(ERR_TRUNCATED % pos)
        vlen = <int32_t>_get_u32(r + pos)
        if vlen == -1:
            pos += 4
            out.append((key, None))
            continue
        if vlen < 0:
            raise ValueError(ERR_VALUE_LENGTH % (vlen, pos))
        pos += 4
        if vlen > n - pos:
            raise ValueError(ERR_TRUNCATED % pos)
        value = PyBytes_FromStringAndSize(<const char*>(r + pos), vlen)
        pos += vlen
        out.append((key, value))
    return out


# --------------------------------------------------------------------------
# Reading a consumed message's headers (see chronos.codec.librdkafka)
# --------------------------------------------------------------------------

ctypedef size_t (*header_cnt_f)(const void* hdrs) noexcept nogil
ctypedef int (*header_get_all_f)(const void* hdrs, size_t idx, const char** name, const void** value,
                                 size_t* size) noexcept nogil

cdef header_cnt_f _header_cnt = NULL
cdef header_get_all_f _header_get_all = NULL
cdef object MESSAGE = _rd.MESSAGE
cdef Py_ssize_t HEADERS_OFFSET = _rd.HEADERS_OFFSET
cdef Py_ssize_t C_HEADERS_OFFSET = _rd.C_HEADERS_OFFSET
cdef Py_ssize_t SER_SIZE_AT = _rd.SER_SIZE_AT
cdef Py_ssize_t VALUE_SIZE_AT = _rd.VALUE_SIZE_AT
cdef Py_ssize_t NAME_SIZE_AT = _rd.NAME_SIZE_AT
cdef Py_ssize_t VALUE_PTR_AT = _rd.VALUE_PTR_AT
cdef size_t MAX_NAME_SIZE = _rd.MAX_NAME_SIZE
if _rd.BINDING is not None:
    _header_cnt = <header_cnt_f><uintptr_t>_rd.BINDING.header_cnt_address
    _header_get_all = <header_get_all_f><uintptr_t>_rd.BINDING.header_get_all_address


cdef inline size_t _varint_size(uint64_t n) noexcept nogil:
    """Bytes librdkafka's zig-zag varint takes for the non-negative size n."""
    cdef size_t size = 1
    n <<= 1
    while n > 0x7F:
        n >>= 7
        size += 1
    return size


cdef inline bint _record_agrees(const char* name, const char* value, size_t size) noexcept nogil:
    """chronos.codec.librdkafka.record_agrees, plus the NUL that ends the name."""
    cdef size_t name_size = (<const size_t*>(name + NAME_SIZE_AT))[0]
    if (<const char**>(name + VALUE_PTR_AT))[0] != value or (<const size_t*>(name + VALUE_SIZE_AT))[0] != size:
        return False
    if name_size > MAX_NAME_SIZE:
        return False
    if (<const size_t*>(name + SER_SIZE_AT))[0] != name_size + size + _varint_size(name_size) + _varint_size(size):
        return False
    if value != NULL and value != name + name_size + 1:
        return False
    return name[name_size] == 0


def read_headers(msg):
    """A consumed message's headers, read from librdkafka's list with each name's true length.

    Same contract as chronos.codec._python.read_headers: ``(headers, error)``, a name that is not
    valid UTF-8 or holds NUL escaped and reported as ``bad_header_name``.
    """
    global _header_cnt
    cdef const void* hdrs
    cdef const char* name
    cdef const void* value
    cdef size_t size, name_size, i, n
    cdef list out
    cdef object key, error = None
    cdef PyObject* decoded
    if _header_cnt == NULL or type(msg) is not MESSAGE:
        return _rd.fallback(msg)
    hdrs = (<const void**>(<char*><PyObject*>msg + C_HEADERS_OFFSET))[0]
    if hdrs == NULL or (<const void**>(<char*><PyObject*>msg + HEADERS_OFFSET))[0] != NULL:
        return msg.headers(), None  # none, or converted (or set) already
    n = _header_cnt(hdrs)
    out = []
    for i in range(n):
        if _header_get_all(hdrs, i, &name, &value, &size) != 0:
            problem = f"rd_kafka_header_get_all failed for header {i}"
            break
        if not _record_agrees(name, <const char*>value, size):
            problem = f"header record {i} does not match rd_kafka_header_get_all's answer"
            break
        name_size = (<const size_t*>(name + NAME_SIZE_AT))[0]
        decoded = NULL
        if memchr(name, 0, name_size) == NULL:
            decoded = _decode_utf8_raw(name, <Py_ssize_t>name_size, NULL)
        if decoded is not NULL:
            key = <object>decoded
            Py_DECREF(key)  # <object> took a second reference
        else:
            if PyErr_Occurred_ptr() != NULL:
                if not PyErr_ExceptionMatches(UnicodeDecodeError):
                    _propagate()
                PyErr_Clear()
            raw = PyBytes_FromStringAndSize(name, <Py_ssize_t>name_size)
            key = escape_header_name(raw)
            if error is None:
                error = bad_header_name(raw)
        if value == NULL:
            out.append((key, None))
        else:
            out.append((key, PyBytes_FromStringAndSize(<const char*>value, <Py_ssize_t>size)))
    else:
        return out, error
    _header_cnt = NULL
    _rd.disable(f"{problem} (native codec)")
    return _rd.fallback(msg)


# --------------------------------------------------------------------------
# PostgreSQL binary COPY of the consumer's rows
# --------------------------------------------------------------------------

from cpython.bool cimport PyBool_Check
from cpython.long cimport PyLong_AsLongLong, PyLong_Check
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from chronos.codec.types import COPY_COLUMNS, COPY_SIGNATURE, COPY_TRAILER, ERR_COPY_FIELD, POSTGRES_EPOCH_US

cdef int64_t C_POSTGRES_EPOCH_US = 946684800000000
if POSTGRES_EPOCH_US != C_POSTGRES_EPOCH_US or COPY_SIGNATURE != b"PGCOPY\n\xff\r\n\x00" + bytes(8):
    raise ImportError("chronos.codec.types COPY constants changed; rebuild the native codec")
if COPY_COLUMNS != ("id", "deadline_us", "topic", "key", "value", "headers", "ordering_key", "cron", "timezone",
                    "dst_policy", "input_partition"):
    raise ImportError("chronos.codec.types.COPY_COLUMNS changed; rebuild the native codec")

# Column kinds, in COPY_COLUMNS order: 0 text, 1 timestamptz from epoch microseconds, 2 bytea, 3 integer.
DEF COPY_NCOLUMNS = 11
cdef int COPY_KIND[COPY_NCOLUMNS]
COPY_KIND[:] = [0, 1, 0, 2, 2, 2, 0, 0, 0, 0, 3]
cdef tuple COPY_NAMES = COPY_COLUMNS
cdef bint COPY_NULLABLE[COPY_NCOLUMNS]
COPY_NULLABLE[:] = [False, False, True, True, True, True, True, True, True, True, True]


cdef struct _Buf:
    unsigned char* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int _reserve(_Buf* b, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap = b.cap
    cdef void* grown
    if b.size + more <= cap:
        return 0
    while cap < b.size + more:
        cap = cap * 2 if cap else 65536
    grown = PyMem_Realloc(b.data, <size_t>cap)
    if grown == NULL:
        raise MemoryError()
    b.data = <unsigned char*>grown
    b.cap = cap
    return 0


cdef inline void _put_u16(unsigned char* w, unsigned int v) noexcept nogil:
    w[0] = <unsigned char>(v >> 8)
    w[1] = <unsigned char>v


cdef inline void _put_u64(unsigned char* w, uint64_t v) noexcept nogil:
    _put_u32(w, <uint32_t>(v >> 32))
    _put_u32(w + 4, <uint32_t>v)


cdef int _copy_field(_Buf* b, object value, int column, Py_ssize_t row) except -1:
    cdef const char* p
    cdef Py_ssize_t n
    cdef int64_t us
    cdef int kind = COPY_KIND[column]
    if value is None:
        if not COPY_NULLABLE[column]:
            raise TypeError(ERR_COPY_FIELD % (row, COPY_NAMES[column], "None"))
        _reserve(b, 4)
        _put_u32(b.data + b.size, 0xFFFFFFFFu)
        b.size += 4
        return 0
    if kind == 1:
        if not PyLong_Check(value):
            raise TypeError(ERR_COPY_FIELD % (row, COPY_NAMES[column], type(value).__name__))
        us = PyLong_AsLongLong(value) - C_POSTGRES_EPOCH_US
        _reserve(b, 12)
        _put_u32(b.data + b.size, 8)
        _put_u64(b.data + b.size + 4, <uint64_t>us)
        b.size += 12
        return 0
    if kind == 3:
        if not PyLong_Check(value) or PyBool_Check(value):
            raise TypeError(ERR_COPY_FIELD % (row, COPY_NAMES[column], type(value).__name__))
        us = PyLong_AsLongLong(value)
        if us < 0 or us > 0x7FFFFFFF:
            raise TypeError(ERR_COPY_FIELD % (row, COPY_NAMES[column], type(value).__name__))
        _reserve(b, 8)
        _put_u32(b.data + b.size, 4)
        _put_u32(b.data + b.size + 4, <uint32_t>us)
        b.size += 8
        return 0
    if kind == 0:
        if not PyUnicode_Check(value):
            raise TypeError(ERR_COPY_FIELD % (row, COPY_NAMES[column], type(value).__name__))
        p = PyUnicode_AsUTF8AndSize(value, &n)
    else:
        if not PyBytes_Check(value):
            raise TypeError(ERR_COPY_FIELD % (row, COPY_NAMES[column], type(value).__name__))
        p = PyBytes_AS_STRING(value)
        n = PyBytes_GET_SIZE(value)
    if n > 0x7FFFFFFF:
        raise ValueError(ERR_TOO_LARGE % (COPY_NAMES[column], n))
    _reserve(b, 4 + n)
    _put_u32(b.data + b.size, <uint32_t>n)
    memcpy(b.data + b.size + 4, p, n)
    b.size += 4 + n
    return 0


def copy_rows(rows, bint input_partition=True):
    """Rows as one PostgreSQL binary COPY stream (signature, one tuple per row, trailer) of the
    columns COPY_COLUMNS: text, timestamptz (from epoch microseconds), bytea, integer; without the
    last, `input_partition`, when not `input_partition` (a schema before it)."""
    cdef _Buf b
    cdef Py_ssize_t i = 0
    cdef int column
    cdef object row
    cdef unsigned int fields = COPY_NCOLUMNS if input_partition else COPY_NCOLUMNS - 1
    b.data = NULL
    b.size = 0
    b.cap = 0
    try:
        _reserve(&b, 19)
        memcpy(b.data, PyBytes_AS_STRING(COPY_SIGNATURE), 19)
        b.size = 19
        for row in rows:
            _reserve(&b, 2)
            _put_u16(b.data + b.size, fields)
            b.size += 2
            _copy_field(&b, row.id, 0, i)
            _copy_field(&b, row.deadline_us, 1, i)
            _copy_field(&b, row.topic, 2, i)
            _copy_field(&b, row.key, 3, i)
            _copy_field(&b, row.value, 4, i)
            _copy_field(&b, row.headers, 5, i)
            _copy_field(&b, row.ordering_key, 6, i)
            _copy_field(&b, row.cron, 7, i)
            _copy_field(&b, row.timezone, 8, i)
            _copy_field(&b, row.dst_policy, 9, i)
            if input_partition:
                _copy_field(&b, row.input_partition, 10, i)
            i += 1
        _reserve(&b, 2)
        memcpy(b.data + b.size, PyBytes_AS_STRING(COPY_TRAILER), 2)
        b.size += 2
        return PyBytes_FromStringAndSize(<const char*>b.data, b.size)
    finally:
        PyMem_Free(b.data)


# --------------------------------------------------------------------------
# The consumer's intake of plain messages
# --------------------------------------------------------------------------

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    PyObject* PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t nitems)

cdef extern from "structmember.h":
    int T_OBJECT_EX
    int READONLY

from cpython.dict cimport PyDict_Contains
from cpython.ref cimport Py_INCREF
import dataclasses as _dataclasses
import types as _pytypes

# The row class's slots, in the order of make_row's arguments, when it is a plain slotted dataclass
# whose other fields default to None: intake then fills a new row's slots directly instead of running
# its generated __init__ (a Python frame per message). Any other make_row is called.
DEF ROW_FIELDS_MAX = 16
cdef object ROW_CLASS = None
cdef bint ROW_DIRECT = False
cdef Py_ssize_t ROW_OFFSETS[ROW_FIELDS_MAX]
cdef Py_ssize_t ROW_NFIELDS = 0
ROW_ARGUMENTS = ("id", "deadline_us", "topic", "key", "value", "headers", "ordering_key", "input_partition")


cdef bint _row_layout(object cls) except -1:
    """Learn `cls`'s slot offsets; False when its rows must be built by calling it."""
    global ROW_CLASS, ROW_DIRECT, ROW_NFIELDS
    cdef PyMemberDef* member
    ROW_CLASS, ROW_DIRECT, ROW_NFIELDS = cls, False, 0
    if not isinstance(cls, type) or not _dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        return False
    if cls.__new__ is not object.__new__ or (<PyTypeObject*>cls).tp_itemsize != 0:
        return False
    fields = _dataclasses.fields(cls)
    if len(fields) > ROW_FIELDS_MAX or tuple(f.name for f in fields[:len(ROW_ARGUMENTS)]) != ROW_ARGUMENTS:
        return False
    for k, f in enumerate(fields):
        if not f.init or (k >= len(ROW_ARGUMENTS) and f.default is not None):
            return False
        descriptor = cls.__dict__.get(f.name)
        if type(descriptor) is not _pytypes.MemberDescriptorType:
            return False
        member = (<PyMemberDescrObject*><PyObject*>descriptor).d_member
        if member.type != T_OBJECT_EX or member.flags & READONLY or member.offset <= 0:
            return False
        ROW_OFFSETS[k] = member.offset
    ROW_NFIELDS = len(fields)
    ROW_DIRECT = True
    return True


cdef inline void _put_slot(PyObject* o, Py_ssize_t offset, object value) noexcept:
    Py_INCREF(value)
    (<PyObject**>(<char*>o + offset))[0] = <PyObject*>value


cdef object _new_row(object mid, object deadline, object key, object value, object headers, object partition):
    """A row with no topic, ordering key nor schedule, its slots filled directly (see _row_layout)."""
    cdef PyObject* o = PyType_GenericAlloc(<PyTypeObject*>ROW_CLASS, 0)
    cdef Py_ssize_t k
    if o == NULL:
        _propagate()
    row = <object>o
    Py_DECREF(row)  # <object> took a second reference
    _put_slot(o, ROW_OFFSETS[0], mid)
    _put_slot(o, ROW_OFFSETS[1], deadline)
    _put_slot(o, ROW_OFFSETS[2], None)
    _put_slot(o, ROW_OFFSETS[3], key)
    _put_slot(o, ROW_OFFSETS[4], value)
    _put_slot(o, ROW_OFFSETS[5], headers)
    _put_slot(o, ROW_OFFSETS[6], None)
    _put_slot(o, ROW_OFFSETS[7], partition)
    for k in range(8, ROW_NFIELDS):
        _put_slot(o, ROW_OFFSETS[k], None)
    return row


cdef inline bint _plain_name(const char* p, size_t n) noexcept nogil:
    """A header name every path reads alike: ASCII without NUL."""
    cdef size_t i
    cdef unsigned char c
    for i in range(n):
        c = <unsigned char>p[i]
        if c == 0 or c >= 0x80:
            return False
    return True


cdef bint _stored_plain(object msg, int64_t now_us, int64_t timing_advance_us, bint has_bound, int64_t bound,
                       const char* out_topic, Py_ssize_t out_topic_size, dict ops, dict sources, object insert_op,
                       object make_row) except -1:
    """Store a message that is plain (see intake), due after the timing advance, with an id not yet in
    the batch and every header name ASCII, read straight from librdkafka's header list: no header list,
    no Parsed, one bytes object for the other headers. False, having changed nothing, for any other
    message: intake's general path then sorts it."""
    cdef const void* hdrs
    cdef const char* name
    cdef const void* value
    cdef const char* id_p = NULL
    cdef const char* deadline_p = NULL
    cdef const char* topic_p = NULL
    cdef size_t size, name_size, i, n, id_n = 0, deadline_n = 0, topic_n = 0
    cdef Py_ssize_t total = 0, pos = 0
    cdef int slot, present = 0
    cdef int64_t deadline
    cdef unsigned char* w
    if _header_cnt == NULL or type(msg) is not MESSAGE:
        return False
    hdrs = (<const void**>(<char*><PyObject*>msg + C_HEADERS_OFFSET))[0]
    if hdrs == NULL or (<const void**>(<char*><PyObject*>msg + HEADERS_OFFSET))[0] != NULL:
        return False
    n = _header_cnt(hdrs)
    for i in range(n):
        if _header_get_all(hdrs, i, &name, &value, &size) != 0 or not _record_agrees(name, <const char*>value, size):
            return False  # read_headers, on the general path, says what is wrong
        name_size = (<const size_t*>(name + NAME_SIZE_AT))[0]
        if not _plain_name(name, name_size):
            return False
        slot = _slot_raw(name, <Py_ssize_t>name_size)
        if slot < 0:
            total += 8 + <Py_ssize_t>name_size + (<Py_ssize_t>size if value != NULL else 0)
            continue
        if present & (1 << slot) or value == NULL:
            return False  # a duplicate Chronos header, or one without a value
        present |= 1 << slot
        if slot == S_ID:
            id_p, id_n = <const char*>value, size
        elif slot == S_DEADLINE:
            deadline_p, deadline_n = <const char*>value, size
        elif slot == S_TOPIC:
            topic_p, topic_n = <const char*>value, size
        else:
            return False  # an action, an ordering key, a schedule
    if id_p == NULL or deadline_p == NULL or id_n == 0 or deadline_n == 0:
        return False
    if topic_p != NULL and (<Py_ssize_t>topic_n != out_topic_size or memcmp(topic_p, out_topic, topic_n) != 0):
        return False
    if not _parse_deadline_c(<const unsigned char*>deadline_p, <Py_ssize_t>deadline_n, &deadline):
        return False
    if (has_bound and now_us - deadline > bound) or deadline <= now_us + timing_advance_us:
        return False
    if memchr(id_p, 0, id_n) != NULL:
        return False
    mid = _utf8_or_none(id_p, <Py_ssize_t>id_n)
    if mid is None or PyUnicode_GET_LENGTH(mid) > C_MAX_ID_LENGTH or PyDict_Contains(ops, mid):
        return False
    if total == 0:
        encoded = b""
    else:
        encoded = PyBytes_FromStringAndSize(NULL, total)
        w = <unsigned char*>PyBytes_AS_STRING(encoded)
        for i in range(n):
            _header_get_all(hdrs, i, &name, &value, &size)
            name_size = (<const size_t*>(name + NAME_SIZE_AT))[0]
            if _slot_raw(name, <Py_ssize_t>name_size) >= 0:
                continue
            pos += _put_header(w + pos, name, <Py_ssize_t>name_size, value, <Py_ssize_t>size)
    if ROW_DIRECT:
        row = _new_row(mid, deadline, msg.key(), msg.value(), encoded, msg.partition())
    else:
        row = make_row(mid, deadline, None, msg.key(), msg.value(), encoded, None, msg.partition())
    ops[mid] = (insert_op, row)
    sources[mid] = msg
    return True


def intake(messages, Py_ssize_t start, int64_t now_us, int64_t timing_advance_us, max_lateness_us, output_topic,
           batch, make_row, insert_op):
    """Sort the plain messages of a poll from ``messages[start]`` on into ``batch``; return the index
    of the first message left to the caller (``len(messages)`` when none is) and what read_headers
    gave for it (or raised).

    Same contract as chronos.codec._python.intake: a plain message (see there) is decided and added
    to ``batch.ops``/``sources``/``late``/``duplicates`` exactly as chronos.domain.intake.decide and
    the consumer's sort_batch would; any other message is left to them.
    """
    cdef list seq = <list>messages if type(messages) is list else list(messages)
    cdef Py_ssize_t i = start, n = PyList_GET_SIZE(seq), duplicates = 0
    cdef dict ops = batch.ops
    cdef dict sources = batch.sources
    cdef list late = batch.late
    cdef object msg, headers, bad_name, parsed, mid, topic, previous, left = None
    cdef int64_t deadline
    cdef bint has_bound = max_lateness_us is not None
    cdef int64_t bound = max_lateness_us if has_bound else 0
    cdef Py_ssize_t out_topic_size
    cdef const char* out_topic = PyUnicode_AsUTF8AndSize(output_topic, &out_topic_size)
    if make_row is not ROW_CLASS:
        _row_layout(make_row)
    try:
        while i < n:
            msg = <object>PyList_GET_ITEM(seq, i)
            if _stored_plain(msg, now_us, timing_advance_us, has_bound, bound, out_topic, out_topic_size, ops, sources,
                             insert_op, make_row):
                i += 1
                continue
            try:
                headers, bad_name = read_headers(msg)
            except Exception as exc:  # the caller dead-letters it with the reason
                left = exc
                break
            left = (headers, bad_name)
            if bad_name is not None:
                break
            parsed = parse_headers(headers)
            # Parsed: error, message_id, deadline_us, topic, ordering_key, action, cron, timezone, headers, dst_policy
            if (<object>PyTuple_GET_ITEM(parsed, 0) is not None or <object>PyTuple_GET_ITEM(parsed, 5) is not None
                    or <object>PyTuple_GET_ITEM(parsed, 6) is not None
                    or <object>PyTuple_GET_ITEM(parsed, 7) is not None
                    or <object>PyTuple_GET_ITEM(parsed, 9) is not None):
                break
            topic = <object>PyTuple_GET_ITEM(parsed, 3)
            if topic is not None:
                if topic != output_topic:
                    break
                topic = None
            deadline = <object>PyTuple_GET_ITEM(parsed, 2)
            if has_bound and now_us - deadline > bound:
                break
            mid = <object>PyTuple_GET_ITEM(parsed, 1)
            previous = ops.get(mid)
            if deadline <= now_us + timing_advance_us:  # late: published now, unless its id waits
                if previous is not None and <object>PyTuple_GET_ITEM(previous, 1) is not None:
                    duplicates += 1
                else:
                    late.append((msg, parsed))
            elif previous is not None:
                if <object>PyTuple_GET_ITEM(previous, 1) is None:  # cancelled earlier in the batch: a replace
                    break
                duplicates += 1
            else:
                ops[mid] = (insert_op, make_row(mid, deadline, topic, msg.key(), msg.value(),
                                                encode_headers(<object>PyTuple_GET_ITEM(parsed, 8)),
                                                <object>PyTuple_GET_ITEM(parsed, 4), msg.partition()))
                sources[mid] = msg
            i += 1
    finally:
        if duplicates:
            batch.duplicates += duplicates
    return i, (left if i < n else None)
