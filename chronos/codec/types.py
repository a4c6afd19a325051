"""Shared types, constants and error texts of the Chronos header codec.

This module is the single source of truth for both codec implementations
(``chronos.codec._python`` and the Cython ``chronos.codec._native``): they import
``Parsed``, the header names, the limits and every error/detail text from here,
so that both produce identical results, including the human-readable detail.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from chronos.codec.topics import MAX_TOPIC_LENGTH, TOPIC_CHARS

__all__ = [
    "Parsed",
    "Codec",
    "HEADER_ID",
    "HEADER_DEADLINE",
    "HEADER_TOPIC",
    "HEADER_ORDERING_KEY",
    "HEADER_ACTION",
    "HEADER_CRON",
    "HEADER_TIMEZONE",
    "HEADER_DST_POLICY",
    "CHRONOS_HEADERS",
    "ACTION_CANCEL",
    "ACTION_REPLACE",
    "MAX_ID_LENGTH",
    "MAX_TOPIC_LENGTH",
    "MAX_ORDERING_KEY_LENGTH",
    "MAX_DEADLINE_MS",
    "MIN_DEADLINE_US",
    "MAX_DEADLINE_US",
    "REASON_CODES",
    "escape_header_name",
    "bad_header_name",
    "CopyRow",
    "COPY_COLUMNS",
]


class Parsed(NamedTuple):
    """Result of :func:`parse_headers`.

    ``error`` is ``None`` when the chronos headers are valid, otherwise
    ``"<reason_code>: <short human detail>"``.  On error the other fields may be
    partial (a field is only filled when its own header was valid); callers only
    trust them when ``error is None``.  ``headers`` always holds every
    non-chronos header, in original order, duplicates and ``None`` values kept.
    """

    error: str | None
    message_id: str | None
    deadline_us: int | None
    topic: str | None
    ordering_key: str | None
    action: str | None
    cron: str | None
    timezone: str | None
    headers: list[tuple[str, bytes | None]]
    dst_policy: str | None = None


HEADER_ID = "chronosMessageId"
HEADER_DEADLINE = "chronosDeadline"
HEADER_TOPIC = "chronosTopic"
HEADER_ORDERING_KEY = "chronosOrderingKey"
HEADER_ACTION = "chronosAction"
HEADER_CRON = "chronosCron"
HEADER_TIMEZONE = "chronosTimeZone"
HEADER_DST_POLICY = "chronosDstPolicy"

#: The only keys treated as chronos headers (matched exactly, case-sensitive).
#: The index of a key in this tuple is the slot number used by both codecs.
CHRONOS_HEADERS = (
    HEADER_ID,
    HEADER_DEADLINE,
    HEADER_ACTION,
    HEADER_TOPIC,
    HEADER_ORDERING_KEY,
    HEADER_CRON,
    HEADER_TIMEZONE,
    HEADER_DST_POLICY,
)

ACTION_CANCEL = "cancel"
ACTION_REPLACE = "replace"

MAX_ID_LENGTH = 128
MAX_ORDERING_KEY_LENGTH = 256
#: 9999-12-31T23:59:59.999Z in epoch milliseconds (largest integer deadline).
MAX_DEADLINE_MS = 253402300799999
#: 0001-01-01T00:00:00Z in epoch microseconds (smallest ISO deadline).
MIN_DEADLINE_US = -62135596800000000
#: 9999-12-31T23:59:59.999999Z in epoch microseconds (largest ISO deadline).
MAX_DEADLINE_US = 253402300799999999

#: Reason codes of parse_headers, in the priority order used when several errors apply
#: (read_headers' ``bad_header_name`` comes before all of them: such a message is not parsed).
REASON_CODES = (
    "duplicate_header",
    "missing_id",
    "empty_id",
    "bad_id",
    "id_too_long",
    "bad_action",
    "missing_deadline",
    "bad_deadline",
    "bad_topic",
    "bad_ordering_key",
    "bad_cron",
)

# --- error texts (shared verbatim by both implementations) -------------------
# ``%s``/``%d`` placeholders are filled with ``%`` formatting in both codecs.
ERR_DUPLICATE = "duplicate_header: %s appears more than once"
ERR_MISSING_ID = "missing_id: no chronosMessageId header"
ERR_EMPTY_ID = "empty_id: chronosMessageId is empty or null"
ERR_BAD_ID = "bad_id: chronosMessageId is not valid UTF-8 or contains NUL"
ERR_ID_TOO_LONG = "id_too_long: chronosMessageId has %d characters (max 128)"
ERR_BAD_ACTION = "bad_action: chronosAction must be 'cancel' or 'replace'"
ERR_MISSING_DEADLINE = "missing_deadline: no chronosDeadline header"
ERR_EMPTY_DEADLINE = "bad_deadline: chronosDeadline is empty or null"
ERR_BAD_DEADLINE = (
    "bad_deadline: chronosDeadline is neither epoch milliseconds nor an "
    "ISO-8601 timestamp within 0001-01-01..9999-12-31 UTC"
)
ERR_BAD_TOPIC = f"bad_topic: chronosTopic must be 1-{MAX_TOPIC_LENGTH} characters of [{TOPIC_CHARS}] and not '.' or '..'"
ERR_BAD_ORDERING_KEY = (
    "bad_ordering_key: chronosOrderingKey must be non-empty UTF-8 of at most "
    "256 characters"
)
ERR_BAD_CRON = "bad_cron: chronosCron must be non-empty UTF-8"
ERR_BAD_TIMEZONE = "bad_cron: chronosTimeZone must be non-empty UTF-8"
ERR_BAD_DST_POLICY = "bad_cron: chronosDstPolicy must be non-empty UTF-8"

# A header name librdkafka hands over that Python's Kafka client cannot carry (read by read_headers).
ERR_NAME_UTF8 = "bad_header_name: header name '%s' is not valid UTF-8 (carried in this copy with its bytes escaped)"
ERR_NAME_NUL = "bad_header_name: header name '%s' contains NUL (carried in this copy with the NUL escaped)"
#: Longest escaped name quoted in a chronosError detail (the dead letter carries the whole name).
MAX_NAME_IN_DETAIL = 64


def escape_header_name(raw: bytes) -> str:
    """A header name that is not valid UTF-8 or holds NUL, as text the Python client can produce:
    every byte that is not UTF-8 becomes ``\\xNN`` (backslashreplace) and so does every NUL."""
    return raw.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


def bad_header_name(raw: bytes) -> str:
    """The ``bad_header_name`` reason for a raw header name that is not valid UTF-8 or holds NUL."""
    escaped = escape_header_name(raw)
    if len(escaped) > MAX_NAME_IN_DETAIL:
        escaped = escaped[:MAX_NAME_IN_DETAIL] + "..."
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return ERR_NAME_UTF8 % escaped
    return ERR_NAME_NUL % escaped


# Type errors (programming errors, raised identically by both codecs).
ERR_VALUE_TYPE = "value of header %s must be bytes or None, not %s"
ERR_KEY_TYPE = "header key must be str, not %s"
ERR_DEADLINE_TYPE = "deadline must be bytes, not %s"
ERR_DATA_TYPE = "encoded headers must be bytes, bytearray, memoryview or None, not %s"

# Storage decoding errors (ValueError).
ERR_TRUNCATED = "corrupt header data: truncated at offset %d"
ERR_KEY_UTF8 = "corrupt header data: key at offset %d is not valid UTF-8"
ERR_VALUE_LENGTH = "corrupt header data: invalid value length %d at offset %d"
ERR_TOO_LARGE = "header %s too large to encode (%d bytes)"


# --- PostgreSQL binary COPY of the consumer's rows (copy_rows) ----------------------------------
#: The columns of a row, in COPY order: `id` text, `deadline_us` timestamptz (given as epoch
#: microseconds), `topic` text, `key`/`value`/`headers` bytea, `input_partition` integer, the rest
#: text. Only id and deadline may not be NULL. `input_partition` is last, left out for a schema before it
#: (version 12).
COPY_COLUMNS = ("id", "deadline_us", "topic", "key", "value", "headers", "ordering_key", "cron", "timezone",
                "dst_policy", "input_partition")
#: A binary COPY stream starts with this signature, flags and header-extension length (both 0)...
COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
#: ... and ends with a field count of -1.
COPY_TRAILER = b"\xff\xff"
#: PostgreSQL's binary timestamptz counts microseconds from 2000-01-01 UTC.
POSTGRES_EPOCH_US = 946_684_800_000_000
ERR_COPY_FIELD = "row %d: %s cannot be copied from %s"


class CopyRow(Protocol):
    """What copy_rows reads of a row (chronos.domain.model.Row has it all)."""

    @property
    def id(self) -> str: ...
    @property
    def deadline_us(self) -> int: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> bytes | None: ...
    @property
    def ordering_key(self) -> str | None: ...
    @property
    def cron(self) -> str | None: ...
    @property
    def timezone(self) -> str | None: ...
    @property
    def dst_policy(self) -> str | None: ...
    @property
    def input_partition(self) -> int | None: ...


class Codec(Protocol):
    """The interface both codec modules implement (for type checking)."""

    IMPL: str

    def parse_headers(self, headers: Iterable[tuple[str, bytes | None]] | None) -> Parsed: ...

    def parse_deadline(self, value: bytes) -> int | None: ...

    def encode_headers(self, headers: Iterable[tuple[str, bytes | None]] | None) -> bytes: ...

    def decode_headers(self, data: bytes | bytearray | memoryview | None) -> list[tuple[str, bytes | None]]: ...

    def read_headers(self, msg: object) -> tuple[list[tuple[str, bytes | None]] | None, str | None]: ...

    def copy_rows(self, rows: Iterable[CopyRow], input_partition: bool = True) -> bytes: ...

    def intake(self, messages: Sequence[Any], start: int, now_us: int, timing_advance_us: int,
               max_lateness_us: int | None, output_topic: str, batch: Any, make_row: Callable[..., Any],
               insert_op: str) -> tuple[int, tuple[Any, str | None] | Exception | None]: ...
