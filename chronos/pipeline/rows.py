"""One row of a bulk-scheduling dataset → a store row, by exactly the consumer's rules.

The columns are turned into the Chronos headers a producer would have sent (`chronosMessageId`,
`chronosDeadline`, `chronosTopic`, `chronosOrderingKey`, then the row's own headers), and those go
through the header codec's parser and `chronos.domain.intake.decide`. There is no second copy of the
rules here: only the mapping from columns to headers. Pure: no Spark, no I/O, `now` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

import orjson

from chronos import codec
from chronos.domain.intake import Rules, Verdict, decide
from chronos.domain.reasons import code_of
from chronos.domain.model import Row

REQUIRED_COLUMNS = ("id", "deadline", "key", "value")
OPTIONAL_COLUMNS = ("topic", "headers", "ordering_key")
COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS


class BadHeaders(ValueError):
    """The `headers` column of a row cannot be read as a list of headers."""


@dataclass
class Stats:
    """What one partition (or the whole job) did with its rows."""

    read: int = 0
    valid: int = 0        # passed validation (stored, or found already waiting)
    scheduled: int = 0    # newly inserted into chronos_messages
    due: int = 0          # valid rows whose deadline had already come when the job started
    rejected: dict[str, int] = field(default_factory=dict)  # reason code → rows

    def reject(self, reason: str) -> None:
        code = code_of(reason)
        self.rejected[code] = self.rejected.get(code, 0) + 1

    def merge(self, other: "Stats") -> "Stats":
        self.read += other.read
        self.valid += other.valid
        self.scheduled += other.scheduled
        self.due += other.due
        for code, n in other.rejected.items():
            self.rejected[code] = self.rejected.get(code, 0) + n
        return self

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def already_waiting(self) -> int:
        """Valid rows not inserted: their id was waiting already (or came earlier in the input)."""
        return self.valid - self.scheduled


def _text_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


def iso_micros(us: int) -> str:
    """Epoch microseconds as the ISO-8601 text the codec reads back exactly (UTC, 6 digits)."""
    seconds, micros = divmod(us, 1_000_000)
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{micros:06d}Z"


def deadline_header(value: Any) -> bytes | None:
    """The `chronosDeadline` header value for a `deadline` cell (None: the header is absent).

    Text is passed as it is (ISO-8601 or epoch milliseconds, as in the header); whole numbers are
    epoch milliseconds; datetimes are exact to the microsecond (naive ones are UTC, like an
    ISO deadline without an offset); a date is its midnight UTC. Anything else becomes its text, which the codec rejects.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).encode()
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float) and value.is_integer():
        return str(int(value)).encode()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return iso_micros((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds).encode()
    if isinstance(value, date):
        return f"{value.isoformat()}T00:00Z".encode()
    return _text_bytes(value)


def _header_value(key: str, value: Any) -> bytes | None:
    if value is None or isinstance(value, (str, bytes, bytearray, memoryview)):
        return _text_bytes(value)
    raise BadHeaders(f"bad_headers: the value of header {key!r} must be text, bytes or null, "
                     f"not {type(value).__name__}")


def header_list(value: Any) -> list[tuple[str, bytes | None]]:
    """The row's own headers, in order: a JSON object, or a JSON list of [key, value] pairs
    (text, or a column of the same shapes: a map, a list of {key, value} structs, or of pairs).

    Values are text (sent as UTF-8), bytes, or null; a list keeps duplicate keys.
    """
    if value is None:
        return []
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise BadHeaders(f"bad_headers: not JSON ({exc})") from None
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = []
        for item in value:
            if isinstance(item, dict) and set(item) == {"key", "value"}:
                items.append((item["key"], item["value"]))
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                items.append((item[0], item[1]))
            else:
                raise BadHeaders("bad_headers: a list of headers must hold [key, value] pairs")
    else:
        raise BadHeaders("bad_headers: headers must be a JSON object or a list of [key, value] pairs")
    out = []
    for key, raw in items:
        if not isinstance(key, str):
            raise BadHeaders(f"bad_headers: header keys must be text, not {type(key).__name__}")
        out.append((key, _header_value(key, raw)))
    return out


def chronos_headers(message_id: Any, deadline: Any, topic: Any = None, ordering_key: Any = None,
                    headers: Any = None) -> list[tuple[str, bytes | None]]:
    """The header list a producer would have sent for this row (raises BadHeaders)."""
    out: list[tuple[str, bytes | None]] = []
    if message_id is not None:
        out.append((codec.HEADER_ID, _text_bytes(message_id)))
    deadline_value = deadline_header(deadline)
    if deadline_value is not None:
        out.append((codec.HEADER_DEADLINE, deadline_value))
    if topic is not None:
        out.append((codec.HEADER_TOPIC, _text_bytes(topic)))
    if ordering_key is not None:
        out.append((codec.HEADER_ORDERING_KEY, _text_bytes(ordering_key)))
    out.extend(header_list(headers))
    return out


def build(message_id: Any, deadline: Any, topic: Any, ordering_key: Any, headers: Any,
          key: Any, value: Any, now_us: int, rules: Rules) -> tuple[Row | None, str | None, bool]:
    """Validate one row: (store row, None, already due) or (None, reason, False)."""
    try:
        wire = chronos_headers(message_id, deadline, topic, ordering_key, headers)
    except BadHeaders as exc:
        return None, str(exc), False
    parsed = codec.parse_headers(wire)
    if parsed.error is None:
        # Bulk scheduling only adds new one-shot messages.
        if parsed.action is not None:
            return None, f"bad_action: chronosAction {parsed.action!r} is not supported by bulk scheduling", False
        if parsed.cron is not None or parsed.timezone is not None:
            return None, "bad_cron: recurring schedules are not supported by bulk scheduling", False
    decision = decide(parsed, now_us, rules)
    if decision.verdict is Verdict.INVALID:
        return None, decision.reason or "invalid", False
    if decision.verdict not in (Verdict.ENQUEUE, Verdict.LATE):
        return None, f"bad_action: {decision.verdict.value} is not supported by bulk scheduling", False
    stored_topic = parsed.topic if parsed.topic != rules.output_topic else None
    # valid headers of a one-shot message carry an id and a deadline (else decide() says INVALID)
    assert parsed.message_id is not None and parsed.deadline_us is not None
    row = Row(id=parsed.message_id, deadline_us=parsed.deadline_us, topic=stored_topic,
              key=_text_bytes(key), value=_text_bytes(value), headers=codec.encode_headers(parsed.headers),
              ordering_key=parsed.ordering_key)
    return row, None, decision.verdict is Verdict.LATE
