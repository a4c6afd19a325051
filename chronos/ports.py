"""The ports: what the roles need from the outside world, as Protocols.

`Store` is implemented by the PostgreSQL adapter (`chronos.adapters.postgres.store.Store`) and by
its in-memory twin (`chronos.adapters.memory.MemoryStore`); both pass the same contract tests.
The roles take a store (or a factory of stores, one per thread) as a constructor argument.

`Publisher` is what the firer and the consumer need of a Kafka producer (confluent-kafka's
`Producer` is one; unit tests use a double that acknowledges on `poll`).
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterable, Protocol, Sequence

from chronos.domain.model import Claimed, Overview, Parked, Row, Stale, Throttled
from chronos.domain.ratelimit import FireRateLimits


class Link:
    """The server behind one store's connection, and its history: written by the store's own thread,
    read whole (a str, an int) by the metrics' thread."""

    def __init__(self) -> None:
        self.server: str | None = None      # "host:port" of the connection open now, None while none is
        self.last_server: str | None = None  # the server of the last connection that worked
        self.connects = 0                    # connections opened
        self.server_changes = 0              # connections that reached another server than the last one
        self.unanswered = 0                  # statements given up at their deadline (connection dropped)
        self.read_only = 0                   # connections dropped because their server was read-only

    def connected(self, server: str) -> str | None:
        """A connection to `server` opened; returns the server it replaces when that is another one."""
        self.connects += 1
        before, self.server = self.last_server, server
        self.last_server = server
        if before is not None and before != server:
            self.server_changes += 1
            return before
        return None

    def lost(self) -> None:
        self.server = None


class Publisher(Protocol):
    """A Kafka producer: `produce` queues a message, and `poll`/`flush` serve its delivery
    reports, calling `on_delivery(err, msg)` (err None once acknowledged) on the calling thread.
    `purge` fails what it has not had acknowledged (reported as purged at the next `poll`/`flush`)."""

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                on_delivery: Callable[[Any, Any], None] | None = None, headers: Any = None) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None: ...


class Store(Protocol):
    """The scheduler's table of waiting messages. One per thread: an implementation need not be
    thread-safe, except `cancel`, which another thread may call to stop a statement running."""

    node_id: uuid.UUID | None
    last_ok: float  # time.monotonic() of the last statement the store answered (for /healthz)
    link: Link      # the server behind the store's connection, and its history (for metrics)

    def close(self) -> None: ...

    def cancel(self) -> None: ...

    # consumer
    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row],
              cancels: Sequence[str]) -> tuple[int, int, int, int]: ...

    def park(self, messages: Sequence[Parked]) -> None: ...

    def waiting_ids(self, ids: Iterable[str]) -> set[str]: ...

    # firer
    def claim(self, limit: int, lookahead_ms: int) -> list[Claimed]: ...

    def claim_limited(self, limits: FireRateLimits, output_topic: str, limit: int,
                      lookahead_ms: int) -> tuple[list[Claimed], bool]: ...

    def claim_schedules(self, limit: int, lookahead_ms: int, now_us: int) -> list[Claimed]: ...

    def delete_fired(self, done: Sequence[Claimed]) -> int: ...

    def release(self, rows: Sequence[Claimed]) -> int: ...

    def retry_later(self, failed: Sequence[tuple[Claimed, str, int]]) -> int: ...

    def park_claimed(self, rows: Sequence[tuple[Claimed, str]], output_topic: str) -> int: ...

    def db_clock_us(self) -> int: ...

    # detector
    def find_stale(self, hold_ms: int, limit: int = 10000) -> list[Stale]: ...

    def reset_stale(self, seen: Sequence[Stale]) -> list[uuid.UUID]: ...

    def overview(self, hold_ms: int, *, exact: bool | None = None) -> Overview: ...

    def throttled(self, output_topic: str) -> list[Throttled]: ...
