"""The domain's types: what the consumer stores, what a firer claims, what operators see.

Plain data, no I/O: the store adapters (PostgreSQL, the in-memory twin) build and take them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


@dataclass(slots=True)
class Row:
    """A message to store (consumer side)."""

    id: str
    deadline_us: int
    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: bytes
    ordering_key: str | None = None
    input_partition: int | None = None  # the input topic's partition it was read from (None: not known)
    cron: str | None = None
    timezone: str | None = None
    dst_policy: str | None = None


class Mark(NamedTuple):
    """Where a firer's claim starts (`ClaimCursor`): past the row at (`deadline_us`, `seq`), and below it only at
    rows whose seq is past `since_seq` (None: at none)."""
    deadline_us: int
    seq: int
    since_seq: int | None = None


@dataclass(slots=True)
class Claimed:
    """A row this firer claimed: published from memory at its deadline, then deleted.

    A row taken by the claim that deletes (CHRONOS_FIRER_CLAIM=delete) is gone from the table once its
    firer's transaction commits: it carries the rest of the row (`ordering_key`, `enqueued_at`, `last_error`),
    to be put back as it was, and `batch`, the firer's number for the transaction that holds it (0: a row
    stamped as claimed, settled by statements of its own)."""

    id: str
    deadline_us: int
    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: bytes | None
    readied_at: datetime
    seq: int = 0
    attempts: int = 0                        # failed publishes so far
    original_deadline_us: int | None = None  # the deadline as scheduled, when a retry moved it
    ctid: str = ""  # where the claimed version of the row lies: delete and hand-back reach it by TID
    ordering_key: str | None = None          # taken rows only: what putting one back needs
    enqueued_at: datetime | None = None
    last_error: str | None = None
    input_partition: int | None = None       # taken rows: the input partition the row was read from (schema 12)
    batch: int = 0                           # taken rows: the held transaction they are in

    @property
    def scheduled_us(self) -> int:
        """The deadline as scheduled: lateness, ordering and the dead letter go by it."""
        return self.deadline_us if self.original_deadline_us is None else self.original_deadline_us


@dataclass(slots=True)
class Parked:
    """A message to keep in chronos_parked: neither its destination nor the dead-letter topic took it."""

    message_id: str | None
    source: str
    topic: str
    deadline: datetime | None
    key: bytes | None
    value: bytes | None
    headers: bytes
    reason: str


@dataclass(slots=True)
class Stale:
    id: str
    readied_at: datetime
    readied_by: uuid.UUID
    ctid: str = ""


ESTIMATE_ABOVE = 1_000_000   # rows: above this, the waiting count is the planner's estimate
DUE_CAP = 1_000_000          # the due-now count stops here


@dataclass(slots=True)
class NodeLoad:
    """Rows one firer node holds claimed."""

    node: uuid.UUID
    rows: int
    past_hold_time: int
    held_for_s: float           # since its oldest claim
    oldest_deadline: datetime


@dataclass(slots=True)
class Throttled:
    """A destination topic under a fire-rate limit: its due rows not yet claimed, and their lateness."""

    topic: str
    rate: float                 # messages per second
    rows: int                   # due and not claimed (at most DUE_CAP)
    lateness_s: float           # how late the oldest of them is (0 when none)


@dataclass(slots=True)
class Overview:
    at: datetime                # database clock
    waiting: int                # unclaimed rows (recurring schedules not included)
    waiting_estimated: bool
    due: int                    # unclaimed rows past their deadline (at most DUE_CAP)
    in_flight: int
    past_hold_time: int         # claimed longer ago than the hold time: suspected failures
    by_node: list[NodeLoad]
    oldest_overdue_s: float | None   # lateness of the most overdue unfired row, claimed or not
    next_deadline: datetime | None   # first deadline still in the future
    schedules: int | None            # recurring schedules, None when the schema has none
    parked: int | None = None        # messages no topic accepted, None when the schema has no such table

    @classmethod
    def build(cls, at: datetime, first: datetime | None, next_deadline: datetime | None, waiting: int | None,
              estimate: int, due: int, nodes: list[NodeLoad], schedules: int | None,
              parked: int | None = None) -> "Overview":
        in_flight = sum(n.rows for n in nodes)
        overdue = [d for d in [first, *(n.oldest_deadline for n in nodes)] if d is not None and d <= at]
        return cls(at=at,
                   waiting=waiting if waiting is not None else max(0, estimate - in_flight - (schedules or 0)),
                   waiting_estimated=waiting is None, due=due, in_flight=in_flight,
                   past_hold_time=sum(n.past_hold_time for n in nodes), by_node=nodes,
                   oldest_overdue_s=(at - min(overdue)).total_seconds() if overdue else None,
                   next_deadline=next_deadline, schedules=schedules, parked=parked)


@dataclass(slots=True)
class Standby:
    """A server replicating from the one a store is connected to (a row of pg_stat_replication). A role
    without pg_read_all_stats sees that a standby is there but not how it is doing: None then."""

    name: str | None            # its application_name (Patroni: the member's name)
    client: str | None          # its address
    state: str | None           # streaming, catchup, startup, backup, stopping
    sync_state: str | None      # sync, quorum, potential, async


@dataclass(slots=True)
class Sessions:
    """The sessions one Chronos process holds on a server (application_name 'chronos ROLE NODE')."""

    role: str
    node: str
    sessions: int
    clients: list[str]          # their client addresses ("local": a Unix socket)
    oldest_start: datetime | None   # the oldest one's backend_start
    visible: bool               # False: another role's sessions, whose address and start this role may not see


@dataclass(slots=True)
class ServerView:
    """The PostgreSQL server a store is connected to, as that server sees itself: for `chronos status`
    and the console, which say which server each process uses."""

    at: datetime                # database clock
    server: str | None          # "host:port" the store reached, as its URL names it (`ports.Link.server`)
    address: str | None         # "host:port" the server says it listens on; None over a Unix socket
    in_recovery: bool           # a standby (or a primary being promoted)
    version: str
    standbys: list[Standby]
    processes: list[Sessions]   # the Chronos processes with a session on this server, of this database

    @property
    def role(self) -> str:
        return "standby" if self.in_recovery else "primary"


@dataclass(slots=True)
class Announced:
    """A process as it last said where it serves /metrics (chronos_processes): for the console and
    `chronos status`, which find every process of every host there."""

    role: str
    node: str
    url: str                    # its /metrics, at the address it gave
    seen_s: float               # how long ago it last said so (database clock)
