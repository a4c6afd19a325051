"""What operators select and see of the store (`chronos show`, `list`, `parked`, `schedules`, the
console): the filters of a search (of what waits, of what is parked), and a message, a listed message, a
parked message (shown, selected, whole) and a recurring schedule as the store gives them back
(`chronos.ports.OperatorsStore`).

States: `waiting` (not claimed, due at `deadline`), `in_flight` (claimed by a firer, which publishes
it from memory at the deadline it was claimed with: stamped as claimed, or taken by a claim that deletes
whose transaction is open), `recurring` (a cron schedule; `deadline` is its next occurrence).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

STATES = ("waiting", "in_flight", "recurring")
ACTIONS = ("cancel", "fire_now", "reschedule")
# on parked messages (`chronos parked replay|drop`), counted in the same totals
PARKED_ACTIONS = ("replay_parked", "drop_parked")
PREVIEW_BYTES = 64   # of a value, what `show` and the parked messages give: a value may be megabytes
# How far ahead of now a listing looks for rows a firer's claim that deletes holds (in flight): a firer claims
# at most its lookahead ahead of a deadline, and its lookahead is under half its hold time. Half the default
# hold time; the commands and the console give half of CHRONOS_HOLD_TIME_MS.
HELD_WITHIN_MS = 2500


def state_of(cron: str | None, claimed: bool) -> str:
    """A row's state: a schedule is `recurring` (never claimed itself), else claimed or not."""
    return "recurring" if cron is not None else "in_flight" if claimed else "waiting"


@dataclass(frozen=True)
class Filters:
    """What `list` and the filtered actions select; None means no condition."""

    due_after: datetime | None = None
    due_before: datetime | None = None
    topic: str | None = None            # a destination other than the output topic
    output_topic: bool = False          # only messages for the output topic (stored as NULL)
    key: bytes | None = None
    ordering_key: str | None = None
    id_prefix: str | None = None
    state: str | None = None

    @property
    def empty(self) -> bool:
        return self == Filters()


# Where a page of `list` ends, for the next to start after it: (deadline in epoch microseconds, seq) in
# deadline order, the id in id order (with an id prefix).
Position = tuple[int, int] | str


@dataclass
class Message:
    """Everything `chronos show` tells about one message or schedule."""

    id: str
    state: str                      # waiting, in_flight, recurring
    deadline: datetime              # for a recurring schedule: its next occurrence
    topic: str                      # the destination (the output topic unless overridden)
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    value_size: int | None          # None: a null value (tombstone)
    value_preview: bytes
    ordering_key: str | None
    enqueued_at: datetime
    firer: uuid.UUID | None = None          # in flight: the firer's node id
    claimed_at: datetime | None = None      # in flight: since when
    cron: str | None = None
    timezone: str | None = None
    dst_policy: str | None = None
    attempts: int = 0                       # failed publishes so far (retried after a backoff)
    last_error: str | None = None           # why the last publish failed
    original_deadline: datetime | None = None   # as scheduled, when a retry's backoff moved `deadline`


@dataclass
class Listed:
    """One message of a `list` page."""

    state: str
    id: str
    deadline: datetime
    seq: int
    topic: str
    key: bytes | None
    ordering_key: str | None
    firer: uuid.UUID | None
    cron: str | None


@dataclass
class ParkedMessage:
    """A message no topic accepted (neither its destination nor the dead-letter topic), kept in
    chronos_parked."""

    number: int                     # its row in chronos_parked (the page's cursor)
    message_id: str | None          # None when the message had no usable id
    source: str                     # `store/<id>`, or `<topic>/<partition>/<offset>` of the input
    topic: str                      # where it was going
    deadline: datetime | None
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    value_size: int | None
    value_preview: bytes
    reason: str
    parked_at: datetime


@dataclass(frozen=True)
class ParkedFilters:
    """What `chronos parked list` and the parked actions select; None means no condition."""

    topic: str | None = None            # where it was going
    reason: str | None = None           # the code its reason starts with (`too_large`, `missing_id`, ...)
    parked_after: datetime | None = None
    parked_before: datetime | None = None
    id_prefix: str | None = None        # message ids starting with this

    @property
    def empty(self) -> bool:
        return self == ParkedFilters()


class ParkedRef(NamedTuple):
    """A parked message as an action selects it: its number, where it was going, and its size (key,
    value and headers, in bytes), by which a replay bounds what it holds at once."""

    number: int
    topic: str
    size: int


class ParkedRecord(NamedTuple):
    """A parked message whole, as a replay publishes it: key, value and headers (encoded by the
    codec) byte for byte."""

    number: int
    message_id: str | None
    topic: str
    key: bytes | None
    value: bytes | None
    headers: bytes | None


class Schedule(NamedTuple):
    """A recurring schedule, for `chronos schedules` and the console."""

    id: str
    cron: str
    timezone: str                   # UTC when the schedule names none
    next_us: int                    # its next occurrence, epoch microseconds
    topic: str | None               # None: the output topic
    ordering_key: str | None
    created_at: datetime
