"""The ports: what the roles and the operators need from the outside world, as Protocols.

The store, one Protocol per caller, so that each thread's type says which statements it may run:
`IntakeStore` (the consumer), `ClaimStore` and `SettleStore` (the firer's claiming and settling
threads), `DetectStore` (the detector), `OperatorsStore` (`chronos show`, `list`, the actions, the
console). `Store` is every role's statements together. Both the PostgreSQL adapter
(`chronos.adapters.postgres.store.Store`) and its in-memory twin (`chronos.adapters.memory.MemoryStore`)
implement `Store` and `OperatorsStore`, and pass the same contract tests. The roles take a store (or a
factory of stores, one per thread) as a constructor argument.

Kafka, one Protocol per caller likewise: `InputMessage` (a message as read: confluent-kafka's `Message`
is one as it is, so nothing is wrapped per message), `InputConsumer` (what the consumer reads, commits and
learns of its group), `GroupWatcher` (the group's progress, read by a client that never joins it),
`Publisher` (what a role's producer publishes and learns back: delivery reports on `poll`/`flush`) and
`KafkaOutage` (the log of a client's outages). The confluent-kafka adapter
(`chronos.adapters.kafka.clients`) and its in-memory twin (`chronos.adapters.kafka.memory`) implement
them and pass the same contract tests; the roles take factories of them as constructor arguments.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from chronos.domain.cells import CellPartition, Fence, Forward
from chronos.domain.delivery import DeliveryError
from chronos.domain.model import Announced, Claimed, Mark, Overview, Parked, Row, Stale, Throttled
from chronos.domain.moves import Change, MoveRecord, MovingRow, Woken
from chronos.domain.operators import (HELD_WITHIN_MS, Filters, Listed, Message, ParkedFilters, ParkedMessage,
                                      ParkedRecord, ParkedRef, Position, Schedule)
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
        self.unanswered_at = 0.0             # time.monotonic() of the last one
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


class InputMessage(Protocol):
    """A message as the consumer reads it (confluent-kafka's `Message` is one as it is): its headers in
    the client's form (a list of (name, value) pairs, or None), key, value, where it was read, and the
    error a read reports instead of a message (None for a message)."""

    def headers(self) -> Any: ...

    def key(self) -> bytes | None: ...

    def value(self) -> bytes | None: ...

    def topic(self) -> str | None: ...

    def partition(self) -> int | None: ...

    def offset(self) -> int | None: ...

    def error(self) -> Any: ...


class InputConsumer(Protocol):
    """The consumer's client of the input topic, a member of its consumer group. One caller at a time.

    `subscribe` joins the group; `on_lost(consumer, partitions)` is called inside `consume` when the
    group's session was lost (each of `partitions` has a `.partition`). `consume` hands out what was
    read (messages and read errors, `error()` set), and serves the group's callbacks. `commit_offsets`
    commits the next offset to read of each (topic, partition); `ends` is each assigned partition's
    position and end (the offset this consumer reads next, the high watermark; negative where not known
    yet), for its lag (raises `KafkaUnanswered` when the client cannot say)."""

    def subscribe(self, topics: list[str], *, on_lost: Callable[[Any, list[Any]], None]) -> None: ...

    def unsubscribe(self) -> None: ...

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]: ...

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = False) -> None: ...

    def ends(self) -> dict[int, tuple[int, int]]: ...

    def pause_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        """Stop fetching these (topic, partition)s (held by this member) until `resume_partitions`; what was
        fetched of them and not handed out yet is dropped."""
        ...

    def resume_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        """Fetch these (topic, partition)s again, from where `seek_partitions` put them (else where it was)."""
        ...

    def seek_partitions(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Read each (topic, partition) again from this offset: what was read past it and not committed is
        handed out again."""
        ...

    def close(self) -> None: ...


class GroupWatcher(Protocol):
    """A client of the consumer group that never joins it: what the whole group has committed."""

    def group_progress(self, topic: str, timeout: float) -> dict[int, int] | None:
        """The group's committed offset of every partition of `topic` (partition -> offset; a partition
        never committed has a negative one), or None when Kafka does not say within `timeout` seconds."""
        ...

    def close(self) -> None: ...


class KafkaOutage(Protocol):
    """The log of a Kafka client's outages: told when the client works again."""

    def ok(self) -> None: ...


class Publisher(Protocol):
    """A Kafka producer: `send` queues a message, and `poll`/`flush` serve its delivery reports,
    calling `on_delivery(err, msg)` (err None once acknowledged, else a `DeliveryError`) on the calling
    thread. `send` never raises: a message the client refuses at once is reported failed through
    `on_delivery` like any other. `purge` fails what it has not had acknowledged (reported as purged at
    the next `poll`/`flush`); `answers` says whether the cluster answers a metadata request in time,
    `list_topics` asks for the metadata (raising when it does not answer in time)."""

    def send(self, topic: str, value: bytes | None, key: bytes | None, headers: list | None,
             on_delivery: Callable[[DeliveryError | None, Any], None]) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None: ...

    def answers(self, timeout: float = 1.0) -> bool: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...

    def partitions(self, topic: str, timeout: float = 10.0) -> int | None:
        """How many partitions `topic` has (None when the cluster does not know it), from every topic's
        metadata (asking for one topic's would let the cluster create it); KafkaUnanswered when it does not
        answer in time."""
        ...


class StoreHandle(Protocol):
    """What every store is: one connection of one process to the table of waiting messages. One per
    thread: an implementation need not be thread-safe, except `cancel`, which another thread may call to
    stop a statement running."""

    node_id: uuid.UUID | None
    last_ok: float  # time.monotonic() of the last statement the store answered (for /healthz)
    last_unanswered: float  # time.monotonic() of the last statement that found PostgreSQL out of reach, 0.0: none
    link: Link      # the server behind the store's connection, and its history (for metrics)

    def close(self) -> None: ...

    def cancel(self) -> None: ...


class Presence(Protocol):
    """Where a process serves /metrics, said in the store (chronos_processes) by the thread of each role that
    uses the store now and then anyway: the consumer's writer, the firer's settler, the detector. Raises
    StoreRejected on a schema without the table (before version 10)."""

    def announce(self, role: str, scheme: str, port: int, address: str | None) -> str:
        """Say (again) that this process serves /metrics on `port`, at `address`, or where None at this
        host's address on its way to PostgreSQL; returns the URL said."""
        ...

    def withdraw(self) -> None:
        """This process no longer serves (it stops)."""
        ...


class IntakeStore(StoreHandle, Presence, Protocol):
    """The consumer's statements: a batch written, messages parked, which late ids are waiting; the input
    partitions this store's cell owns."""

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row], cancels: Sequence[str],
              fence: Fence | None = None, *, forward: bool = False) -> tuple[int, int, int, int]:
        """One batch in one transaction: (inserted, replaced, cancelled, cancelled in flight). With `forward`
        (cells), the cancels that found nothing and the replaces are noted in the same transaction, to forward
        to the other cells. With a `fence`, checked last in the same transaction: CellMapChanged, and nothing
        written, when the cell no longer owns the partitions written at the fence's epochs."""
        ...

    def pending_forwards(self, limit: int) -> list[Forward]:
        """Up to `limit` of the cancels and replaces noted here to forward to the other cells, oldest first;
        CellsUnsupported on a schema before version 13."""
        ...

    def cancel_forwarded(self, ids: Sequence[str]) -> dict[str, bool]:
        """Cancel these ids here, forwarded from another cell: each one found, with whether it was in flight."""
        ...

    def forget_forwards(self, forwards: Sequence[Forward]) -> None:
        """These were forwarded to every other cell: forgotten, unless noted again since, or being noted again now
        (by a write not ended yet: left, to forward again, rather than waited for)."""
        ...

    def cell_partitions(self) -> list[CellPartition]:
        """The input partitions this cell lists, in order (none: it owns every one, or none among several
        cells); CellsUnsupported on a schema before cells (version 11)."""
        ...

    def note_reach(self, group: str, reached_ms: Mapping[str, int]) -> dict[str, int] | None:
        """With cells: this consumer (the store's node) of consumer group `group` says here that it reached each
        cell of `reached_ms` that many milliseconds ago; returns, for each cell another consumer of the group
        said here that it reached, how many milliseconds ago the latest one did. None on a schema without
        chronos_consumer_reach (before version 16)."""
        ...

    def park(self, messages: Sequence[Parked]) -> None: ...

    def waiting_ids(self, ids: Iterable[str]) -> set[str]: ...

    def db_clock_us(self) -> int: ...


class ShareStore(StoreHandle, Protocol):
    """The firers' shares of the due rows (`chronos.domain.shares`): a firer's lease (the claim of its own
    slices is `DueClaims.claim_share`)."""

    def firer_heartbeat(self, hold_ms: int) -> dict[uuid.UUID, int]:
        """Renew this firer's lease; the other firers whose lease is younger than `hold_ms`, each with
        its age in milliseconds."""
        ...

    def firer_leave(self) -> None:
        """Give this firer's slices up at once."""
        ...


class DueClaims(Protocol):
    """The two claims of a claimer's pass over the due rows (`Claimer.claim_rows`): a `ClaimStore`'s, which
    stamp the rows as the firer's, or a `TakeStore`'s, which delete them in the transaction it holds."""

    def claim(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
              after: Mark | None = None) -> list[Claimed]:
        """Claim up to `limit` rows due within `lookahead_ms`, in (deadline, seq) order; with
        `window_ms`, only rows due at most that long ago (a cheaper claim: see `Claimer.claim_rows`);
        with `after`, only rows past its mark in that order and, within the window, rows below it whose seq
        is past its `since_seq` (`ClaimCursor`)."""
        ...

    def claim_whole(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        """`claim`, and whether it took every row it chose (none held back by its ordering key, none changed
        since it was chosen): then no row it passed over waits below the last it took. A claim that cannot
        tell says False unless it came back full."""
        ...

    def last_seq(self) -> int | None:
        """The last seq the messages' rows have drawn (None: the schema cannot say, before version 18)."""
        ...

    def claim_share(self, slices: tuple[int, ...], limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        """`claim_whole` within these slices."""
        ...


class TokenStore(Protocol):
    """The fire-rate buckets as the claim that deletes uses them: tokens set aside before its claim, in a
    transaction of their own (its held transaction would keep the bucket locked, and every other firer
    waiting on it, until its commit), and those its claim did not use given back."""

    def reserve_tokens(self, name: str, topic: str | None, rate: float, limit: int) -> int:
        """Refill the bucket `name` (of `topic`'s rows: None, the output topic's) and take up to `limit`
        tokens from it, when rows of the topic are due: how many it gave."""
        ...

    def return_tokens(self, name: str, rate: float, count: int) -> None:
        """Give `count` tokens taken and not used back to the bucket `name` (up to what it holds at most)."""
        ...


class ClaimStore(ShareStore, DueClaims, TokenStore, Protocol):
    """The statements of the firer's claiming thread: due rows and due occurrences claimed."""

    def claim_limited(self, limits: FireRateLimits, output_topic: str, limit: int,
                      lookahead_ms: int) -> tuple[list[Claimed], bool]: ...

    def claim_schedules(self, limit: int, lookahead_ms: int, now_us: int) -> list[Claimed]: ...


class TakeStore(StoreHandle, DueClaims, Protocol):
    """A firer's session for the claim that deletes (CHRONOS_FIRER_CLAIM=delete). Its claims delete the rows
    they take, in a transaction the session holds open (begun by the first of them) until `finish` commits
    it, the rows gone for good once Kafka acknowledged them, or `give_back` rolls it back, every row back as
    it was. While it is open the rows are this firer's alone: other claims skip them, operators and status
    see them in flight, a write of the same id waits for it to end. PostgreSQL ends the transaction of a
    session silent for the hold time (its firer dead, hung or cut off), and the rows are back. One batch at a
    time: a firer holds a session per batch in flight."""

    def claim_limited(self, limits: FireRateLimits, output_topic: str, limit: int, lookahead_ms: int,
                      tokens: TokenStore) -> tuple[list[Claimed], bool]:
        """`ClaimStore.claim_limited`, deleting, with the tokens of each limited topic set aside in `tokens`
        first and what was not used given back."""
        ...

    def finish(self, restore: Sequence[Claimed], retry: Sequence[tuple[Claimed, str, int]],
               park: Sequence[tuple[Claimed, str]], output_topic: str) -> None:
        """Settle the batch and commit: put `restore` back as taken (handed back), `retry` back with the
        failure counted and the deadline put off (row, error, delay_ms), `park` into the parked messages
        (row, reason); every other row taken is gone. StoreUnavailable when the transaction had ended
        already (held past the hold time, or PostgreSQL lost): every row is back, or, where the commit
        itself was lost on the way, possibly gone."""
        ...

    def give_back(self) -> None:
        """Roll the batch back: every row taken is back as it was. Never fails: a session that cannot reach
        PostgreSQL is closed, and PostgreSQL rolls back what it held."""
        ...


class SettleStore(StoreHandle, Presence, Protocol):
    """The statements of the firer's settling thread: claimed rows deleted once published, handed back,
    retried later or parked; and the database clock."""

    def delete_fired(self, done: Sequence[Claimed]) -> int: ...

    def release(self, rows: Sequence[Claimed]) -> int: ...

    def retry_later(self, failed: Sequence[tuple[Claimed, str, int]]) -> int: ...

    def park_claimed(self, rows: Sequence[tuple[Claimed, str]], output_topic: str) -> int: ...

    def db_clock_us(self) -> int: ...


class DetectStore(StoreHandle, Presence, Protocol):
    """The detector's statements: rows held past the hold time found and handed back; its gauges."""

    def find_stale(self, hold_ms: int, limit: int = 10000) -> list[Stale]: ...

    def reset_stale(self, seen: Sequence[Stale]) -> list[uuid.UUID]: ...

    def overview(self, hold_ms: int, *, exact: bool | None = None) -> Overview: ...

    def throttled(self, output_topic: str) -> list[Throttled]: ...

    def gauge_reader(self, within_ms: int) -> uuid.UUID | None:
        """The detector that reads the store gauges for all: the first by node in chronos_processes (said within)."""


class CellMapStore(StoreHandle, Protocol):
    """Changes of a cell's list of input partitions, each made once the writes that checked their fence
    against the list have ended, and before any other write checks it."""

    def open_partitions(self, partitions: Sequence[int], epoch: int) -> list[int]:
        """List these partitions in this cell, open, at `epoch`; returns those opened (one listed already at
        `epoch` or higher is left as it is)."""
        ...

    def close_partitions(self, partitions: Sequence[int]) -> dict[int, int]:
        """Mark these partitions moving, each at its epoch + 1 (a write fenced at the epoch before is refused
        from now on); returns partition -> its new epoch, for those this cell lists."""
        ...


class MoveStore(StoreHandle, Protocol):
    """A move of an input partition between cells (`chronos.domain.moves`, `chronos.ops.moves`): the statements
    it runs on the cell the partition leaves (the source: its record, watch, freeze, rows and their changes)
    and on the cell it goes to (the target: rows put there dormant or live, and woken)."""

    def moves(self) -> list[MoveRecord]:
        """The moves of partitions leaving this cell, by partition; CellsUnsupported on a schema before moves
        (version 13)."""
        ...

    def begin_move(self, partition: int, target: str, node: uuid.UUID, ahead_ms: int) -> None:
        """Record a move of `partition` to `target`, copying, its horizon `ahead_ms` from now, its lease `node`'s;
        a move of it recorded already is left as it is."""
        ...

    def lease_move(self, partition: int, node: uuid.UUID, lease_ms: int) -> bool:
        """Take or renew the move's lease for `node`: whether it holds it now (False: another node renewed it
        within `lease_ms`)."""
        ...

    def save_move(self, partition: int, node: uuid.UUID, step: str, cursor: int) -> bool:
        """Record the move's step and copy cursor, if `node` still holds its lease."""
        ...

    def end_move(self, partition: int) -> None:
        """Forget the move: its record, its noted changes, its outbox."""
        ...

    def watch(self, partition: int, *, wait_ms: int = 0) -> bool:
        """Note every row of the partition written from now on (`changes`); False when the table was too busy
        to change its triggers just now (nothing done: try again). With no `wait_ms` a try takes the table's lock
        only if it is free at once, holding no write behind it; with it, it waits that long for the lock (every
        write of the table waiting behind it meanwhile), for a table never free at once: one whose firers' claims
        that delete hold a batch each, back to back, until Kafka acknowledged it."""
        ...

    def freeze(self, partition: int) -> int | None:
        """Close the partition in this cell's list (its epoch + 1, unless closed already) and freeze its rows
        here: no firer claims one, nothing changes one, but for a firer settling a row it holds and the move.
        Returns the partition's epoch here; None when the table was too busy (nothing done: try again)."""
        ...

    def unwatch(self, partition: int, *, wait_ms: int = 0) -> bool:
        """Drop the partition's watch and freeze; False when the table was too busy (try again; `wait_ms` as for
        `watch`)."""
        ...

    def scan(self, partition: int, cursor: int, after_us: int, rows: int) -> tuple[list[MovingRow], int | None]:
        """The partition's rows due after `after_us` (no recurring schedule) in the next stretch of the table
        from `cursor`, of about `rows` rows of any partition, and the cursor after it (None: the end of the
        table)."""
        ...

    def changes(self, partition: int, limit: int) -> list[Change]:
        """Up to `limit` rows of the partition noted since the watch began, oldest change first."""
        ...

    def forget(self, partition: int, changes: Sequence[Change]) -> None:
        """Forget these changes, but for the rows noted again since, or being noted again now (by a write not
        ended yet: left, to carry again, rather than waited for)."""
        ...

    def held(self, partition: int, until_us: int) -> int:
        """Rows of the partition a firer of this cell holds in flight: stamped as claimed, or, due up to `until_us`,
        held by a firer's claim that deletes (its transaction open: the row still here, gone if it commits)."""
        ...

    def hand_over(self, partition: int, until_us: int, limit: int,
                  put: Callable[[Sequence[MovingRow]], object]) -> int | None:
        """Hand over up to `limit` rows of the partition waiting here, due up to `until_us` (no schedule), by
        deadline, not those a firer's claim that deletes holds: each locked (waiting a moment at most for a
        statement under way that changes it), given to `put` (the cell it goes to), then deleted here. How many;
        None when a row stayed locked (nothing handed: try again)."""
        ...

    def ship_schedules(self, partition: int) -> list[MovingRow]:
        """Take the partition's recurring schedules out of the table into the move's outbox (in one
        statement); return what the outbox holds of the partition."""
        ...

    def shipped(self, partition: int) -> None:
        """Empty the move's outbox of the partition (the target has its schedules)."""
        ...

    def drop_due(self, partition: int, until_us: int, limit: int) -> int:
        """Delete up to `limit` rows of the partition waiting here due up to `until_us`: how many."""
        ...

    def drop_scan(self, partition: int, cursor: int, rows: int) -> int | None:
        """Delete the partition's rows in the next stretch of the table from `cursor`, of about `rows` rows of any
        partition; the cursor after it (None: the end of the table)."""
        ...

    def seq_position(self) -> int:
        """Where the table's enqueue order (seq) stands."""
        ...

    def seq_at_least(self, seq: int) -> None:
        """Make the enqueue order go on past `seq`."""
        ...

    def put(self, rows: Sequence[MovingRow], *, dormant: bool) -> int:
        """Write rows carried from another cell: dormant (held by the move until woken) or live; a row of the
        same id is overwritten only if it is one the move put here dormant. How many were written."""
        ...

    def drop_copies(self, ids: Sequence[str]) -> int:
        """Delete the dormant copies of these ids: how many."""
        ...

    def wake(self, partition: int, until_us: int | None, limit: int, after: int | None = None) -> Woken:
        """Make up to `limit` of the partition's dormant rows due up to `until_us` (None: any) waiting, the
        earliest first, from `after` on (the `resume` of the last call; None: from the first). A row put dormant
        behind `after` meanwhile is found only by a call from the first."""
        ...

    def live_firers(self, hold_ms: int) -> int:
        """The firers of this cell whose lease is younger than `hold_ms`."""
        ...


class Store(IntakeStore, ClaimStore, SettleStore, DetectStore, CellMapStore, Protocol):
    """Every role's statements: what both stores implement and the contract suite checks."""


class OperatorsStore(StoreHandle, Protocol):
    """What operators ask of the store and do to it (`chronos.ops.inspect`, `chronos.ops.parked`, `chronos
    schedules`, the console). An action changes only rows no firer holds."""

    def show(self, message_id: str, *, output_topic: str) -> Message | None:
        """The message or schedule with this id (its value's first PREVIEW_BYTES only), or None."""
        ...

    def list_messages(self, f: Filters, *, output_topic: str, limit: int, after: Position | None = None,
                      not_at: datetime | None = None, held_within_ms: int = HELD_WITHIN_MS) -> list[Listed]:
        """Up to `limit` rows matching `f` (and whose deadline is not `not_at`) after the position `after`: in
        (deadline, seq) order, in id order with an id prefix. Rows held by a firer's claim that deletes are
        found in flight among those due within `held_within_ms`."""
        ...

    def key_search(self) -> bool:
        """Whether a search by key (`Filters.key`) reads an index here (`chronos key-search on`); without one it
        reads the rows in deadline order until its page is full."""
        ...

    def list_parked(self, *, limit: int, before: int | None = None,
                    filters: ParkedFilters | None = None) -> list[ParkedMessage]:
        """Up to `limit` parked messages numbered below `before` (and matching `filters`), newest first."""
        ...

    def show_parked(self, number: int) -> ParkedMessage | None:
        """The parked message of this number (its value's first PREVIEW_BYTES only), or None."""
        ...

    def find_parked(self, numbers: Sequence[int]) -> list[ParkedRef]:
        """Those of these numbers that are parked, oldest first."""
        ...

    def walk_parked(self, filters: ParkedFilters, *, limit: int, after: int | None = None) -> list[ParkedRef]:
        """Up to `limit` parked messages matching `filters` numbered above `after`, oldest first."""
        ...

    def load_parked(self, numbers: Sequence[int]) -> list[ParkedRecord]:
        """Those of these parked messages still parked, whole (key, value and headers), oldest first."""
        ...

    def settle_replayed(self, replayed: Sequence[int], refused: Sequence[tuple[int, str]], *, counted: bool) -> int:
        """After a replay: delete the parked messages Kafka acknowledged (`replayed`), give those it refused
        their new reason (number, reason), and add to the replays' totals (one more time taken when
        `counted`, and the messages deleted), in one transaction. Returns how many were deleted."""
        ...

    def drop_parked(self, numbers: Sequence[int], *, counted: bool) -> list[int]:
        """Delete these parked messages and add to the drops' totals (as `settle_replayed`), in one
        transaction. Returns the numbers deleted."""
        ...

    def list_schedules(self) -> list[Schedule]:
        """Every recurring schedule, by next occurrence."""
        ...

    def present(self, ids: Sequence[str]) -> dict[str, bool]:
        """Of these ids, those the store holds, each with whether a firer holds it (in flight)."""
        ...

    def apply_action(self, action: str, ids: Sequence[str], at: datetime | None, *, counted: bool) -> list[str]:
        """Cancel, fire now (due at `at`, or earlier) or reschedule (to `at`) those of these rows that no firer
        holds, and add to the action's totals (one more time taken when `counted`, and the rows changed), in
        one transaction. Returns the ids changed."""
        ...

    def action_totals(self) -> dict[str, tuple[int, int]]:
        """action -> (times taken, messages changed), over the store's life."""
        ...

    def announced(self, within_ms: int) -> list[Announced]:
        """The processes that said where they serve /metrics within the last `within_ms` (`Presence`); none
        on a schema without chronos_processes (before version 10)."""
        ...

    def db_clock_us(self) -> int: ...


class ProcessServices(Protocol):
    """What a process's life (`chronos.runtime.process`) asks of PostgreSQL and Kafka before its role starts;
    `chronos.processes` gives the real ones, built on the process's settings."""

    def clients(self) -> str:
        """The client libraries the process runs on, for its start line (psycopg's implementation, libpq)."""
        ...

    def check_store(self) -> str:
        """Whether PostgreSQL answers with a schema this chronos runs on: the pool mode the process talks in
        (CHRONOS_DATABASE_POOL_MODE settled). StoreUnavailable while it does not answer (asked again);
        StoreRefused, SchemaError, UnsupportedServer or ConfigError where waiting would not help."""
        ...

    def probe_kafka(self, timeout: float) -> str | None:
        """Why Kafka does not answer yet, or None when it does; KafkaRefused when it refuses the settings."""
        ...
