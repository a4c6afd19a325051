"""What the firer's three threads hand each other (see the package's docstring): the state they
share (`Shared`, with the running totals `FirerTotals`), the rows the claimer hands the sender
(`Claims`), and the outcomes the sender sends the settler (`Outcomes`, then `Stop`)."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, TypeAlias

from chronos.domain.model import Claimed
from chronos.roles.firer.decisions import PublishTiming


class FirerTotals:
    """The firer's running totals, exported as counters (`FirerTelemetry.totals`) and logged at
    the end. `claimed` is written by the claimers (`Shared.count_claimed`), `expired` by the sender, the others by the
    settler; `released` also by the sender's thread at shutdown, once the settler has ended."""

    __slots__ = ("claimed", "fired", "vanished", "released", "retried", "dead", "parked", "expired")

    def __init__(self) -> None:
        self.claimed = self.fired = self.vanished = self.released = self.retried = self.dead = self.parked = 0
        self.expired = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


def size_of(rows: Iterable[Claimed]) -> int:
    """The bytes of the rows' keys, values and headers: what holding them costs, near enough."""
    return sum(len(r.key or b"") + len(r.value or b"") + len(r.headers or b"") for r in rows)


class Shared:
    """What the firer's threads know of each other. Every field has one writer, or one lock its
    writers take; the others only read it (an int or a float, read whole under the GIL).

    A row is *held* from its claim (SQL: `readied_at` set) until it is settled: deleted once
    fired or dead-lettered, handed back, put off for a retry, or parked.

    - the claimers write `totals.claimed`, the rows they ever claimed, `claimed_bytes`, their size, and
      `reserved`, the rows of the cap set aside for the claims on their way, under `claims_lock`
      (`reserve`, `count_claimed`): the firer has one count of rows held, and one cap, however many
      claimers it runs;
    - the settler writes `settled`, the rows it ever settled, `settled_bytes`, their size, and
      `timing.offset_us`, the database
      clock's offset, which the sender reads;
    - the sender writes `in_flight`, `ack_progress`, `sent_at`, `timing.latency`,
      `claims_resume_at` and `kafka_stall_at`, which the claimer reads.
    """

    def __init__(self, timing: PublishTiming):
        self.totals = FirerTotals()
        self.settled = 0
        self.claimed_bytes = 0
        self.settled_bytes = 0
        self.reserved = 0         # rows of the cap set aside for claims on their way (`reserve`)
        self.claims_lock = threading.Lock()
        self.timing = timing
        self.in_flight = 0        # publishes waiting for Kafka's acknowledgement
        self.ack_progress = 0.0   # monotonic: the last acknowledgement, or the first publish since none was in flight
        self.sent_at: deque[float] = deque()  # monotonic send time of each publish in flight, oldest first
        self.claims_resume_at = 0.0  # monotonic: rows were handed back for a producer fault; claim none before
        # monotonic: when the producer was replaced for a stall (nothing acknowledged for the stall time),
        # None once an acknowledgement came since
        self.kafka_stall_at: float | None = None

    def held(self) -> int:
        """Rows claimed by this firer and not settled yet."""
        return self.totals.claimed - self.settled

    def held_bytes(self) -> int:
        """The size (`size_of`) of the rows claimed by this firer and not settled yet."""
        return self.claimed_bytes - self.settled_bytes

    # -- written by the claimers ---------------------------------------------------------------

    def reserve(self, limit: int, max_held: int, max_held_bytes: int) -> int:
        """Set aside up to `limit` rows of the cap on held rows (`max_held`) for a claim about to be
        sent, none while the rows held come to `max_held_bytes`: how many. Two claimers on their way
        at once never claim more together than the cap has room for; `count_claimed` gives the rows
        set aside back once the claim has come."""
        with self.claims_lock:
            room = max_held - self.held() - self.reserved
            if room <= 0 or self.held_bytes() >= max_held_bytes:
                return 0
            granted = min(limit, room)
            self.reserved += granted
            return granted

    def count_claimed(self, rows: list[Claimed], reserved: int = 0) -> None:
        """Count `rows` as held (claimed), and give back `reserved` rows set aside for their claim."""
        size = size_of(rows)
        with self.claims_lock:
            self.totals.claimed += len(rows)
            self.claimed_bytes += size
            self.reserved -= reserved

    def stalled(self, now: float) -> float:
        """How long Kafka has kept the firer waiting (`now` monotonic): since the last acknowledgement
        while publishes are in flight, or the age of the oldest publish in flight, whichever is
        longer. Acknowledgements come back about in publish order, so one send time is dropped from
        the front per acknowledgement."""
        stalled = now - self.ack_progress if self.in_flight else 0.0
        try:
            return max(stalled, now - self.sent_at[0])
        except IndexError:  # emptied by the sender meanwhile
            return stalled

    # -- written by the sender ----------------------------------------------------------------

    def sending(self, sent: float) -> None:
        if not self.in_flight:
            self.ack_progress = time.monotonic()
        self.in_flight += 1
        self.sent_at.append(sent)

    def delivered(self, count: int = 1) -> None:
        """`count` publishes were answered (acknowledged or failed)."""
        self.in_flight -= count
        sent_at = self.sent_at
        for _ in range(min(count, len(sent_at))):
            sent_at.popleft()
        self.ack_progress = time.monotonic()


@dataclass
class Outcomes:
    """What became of held rows, sent by the sender to the settler, which settles them in the store."""

    acked: list[Claimed] = field(default_factory=list)                  # acknowledged: to delete
    release: list[Claimed] = field(default_factory=list)                # not published: to hand back as they are
    retry: list[tuple[Claimed, str, int]] = field(default_factory=list)  # (row, error, delay_ms): refused, try later
    dead: list[tuple[Claimed, str]] = field(default_factory=list)        # (row, reason): dead-lettered, to delete
    park: list[tuple[Claimed, str]] = field(default_factory=list)        # (row, reason): the dead-letter topic refused

    def __bool__(self) -> bool:
        return bool(self.acked or self.pending())

    def pending(self) -> bool:
        """Rows settled at once (acknowledged rows are deleted in batches)."""
        return bool(self.release or self.retry or self.dead or self.park)

    def add(self, other: "Outcomes") -> None:
        self.acked += other.acked
        self.release += other.release
        self.retry += other.retry
        self.dead += other.dead
        self.park += other.park

    def count(self) -> int:
        return len(self.acked) + len(self.release) + len(self.retry) + len(self.dead) + len(self.park)


class Stop:
    """Sent to the settler after the last `Outcomes`: settle them all, then end."""


# The claimer → the sender: each claim's rows, with the time the claim was sent (monotonic).
Claims: TypeAlias = "queue.SimpleQueue[tuple[float, list[Claimed]]]"
# The sender → the settler: outcomes to settle, then the stop.
ToSettle: TypeAlias = "queue.SimpleQueue[Outcomes | Stop]"
