"""The limit of the design: the hot path's own SQL (the consumer's COPY, the firer's claim and delete, the
detector's scan) driven as fast as this machine allows, with no Kafka and no Python per message.

    python -m benchmarks.design_limit                       # both layouts, 30 s each
    python -m benchmarks.design_limit --layout 2/2/2 --duration 60 --out limit.json
    python -m benchmarks.design_limit --claims shares                   # each firer claims its own slices
    python -m benchmarks.design_limit --variants today,delete-claim --rounds 3 --hold-ms 100 --vacuum owed

Per layout (consumers/firers/detectors), as many connections as Chronos opens: one COPY connection per
consumer, a claim and a delete connection per firer (with the firer's planner settings and
`synchronous_commit = off`), one scan connection per detector. The COPY streams are built before the
clock starts (binary, as the consumer's native codec writes them, rows of the size the hot-path benchmark
uses: a 100-byte value and two application headers); the claim is Chronos's own statement (of recent
deadlines, with a full one at least every half second, as the firer takes them) with its RETURNING folded
into three text arrays, which the delete takes back as they are, so no Python runs per
row. Writers stop while more than `--backlog` rows wait, so the table stays the size a balanced stack
keeps and the figure is the rate at which rows go in, are claimed and go out. A firer settles a batch
`--hold-ms` after its claim: the time Kafka takes to acknowledge a publish (0: at once).

`--variants` runs other designs of the claim and the schema beside today's statements (the list is in
`--help`), each in a database of its own on one server, interleaved: every round runs each variant once
in each layout, in an order that turns round by round, so the machine's speed of the hour cancels out of
the ratio of a variant to today's statements of the same round. Each step checks that every row written
was deleted or is still in the table: a variant that loses or duplicates a row reports no rate.

Reports, per message deleted in the measured window: the rate; the CPU of every PostgreSQL process (its
backends, WAL writer, checkpointer, autovacuum); the WAL it wrote (pg_current_wal_lsn), with its records
by kind (pg_walinspect); the index entries written, counted from those records (a B-tree leaf insert
(INSERT_LEAF, INSERT_POST, SPLIT_L, SPLIT_R: a split's record carries the entry that caused it) or a hash
insert is one entry each; PostgreSQL counts index entries nowhere else); the row versions made dead
(pg_stat_user_tables: updates and deletes, per row inserted) and how many were HOT updates. With
`--vacuum owed` autovacuum is off for the steps' tables: a VACUUM after the warm-up leaves the window none
of the warm-up's dead rows, and a VACUUM after the window, whose CPU and WAL are counted beside the
window's, removes what the window left (autovacuum's naptime is a minute: within a 30 s step it runs or
not by chance). Chronos's own figures on the same kind of stack come from `benchmarks.sla` and are set
against these on docs/benchmarks pages.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, NamedTuple

import orjson
import psycopg

from benchmarks.harness import report
from benchmarks.harness.database import database_url_for, migrated_postgres
from chronos import codec
from chronos.adapters.postgres.queries import QUERIES
from chronos.domain.model import Row
from chronos.domain.shares import SLICES, slice_span, slices_of
from chronos.roles.firer.claiming import FULL_CLAIM_EVERY, MAX_HELD_BATCHES, RECENT_WINDOW_MS
from chronos.roles.firer.decisions import full_claim_again

BATCH = 2000
VALUE = b"x" * 100
APP_HEADERS = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
               ("content-type", b"application/json")]
LAYOUTS = {"1/1/1": (1, 1, 1), "2/2/2": (2, 2, 2)}
POLL_S = 0.1  # CHRONOS_POLL_INTERVAL_MS's default
HOLD_TIME_MS = 5000  # CHRONOS_HOLD_TIME_MS's default
LOOKAHEAD_MS = 300
TABLE = "chronos_messages"

# A schema in which a claim can be a HOT update (no index holds or filters on readied_at or readied_by, so
# the claim writes no index entry, only a new row version on the same page when it has room): the claim's
# index scan then steps over the rows in flight, and the detector finds them through the due range.
HOT_SCHEMA = (
    "DROP INDEX chronos_messages_readied",
    "DROP INDEX chronos_messages_topic",
    "CREATE INDEX chronos_messages_topic ON chronos_messages (topic, deadline, seq) WHERE topic IS NOT NULL",
)
SCHEMAS = {"current": (), "hot": HOT_SCHEMA}
HOT_FIND_STALE = ("SELECT id, readied_at, readied_by, ctid FROM chronos_messages "
                  "WHERE cron IS NULL AND deadline <= now() + interval '1 hour' AND readied_at IS NOT NULL "
                  "AND readied_at < now() - %(hold_ms)s * interval '1 millisecond' LIMIT %(limit)s")

# -- the candidates' statements, beside today's (chronos/adapters/postgres/sql/queries.sql) ---------------

# Today's claim ends by stamping the rows it took as this firer's: a second version of each row, never a
# HOT update (it leaves the in-flight index's predicate), with entries in the primary key and the
# in-flight index; the delete then marks that version dead too.
STAMP = ("UPDATE chronos_messages AS m\nSET readied_at = now(), readied_by = %(node)s\nFROM due\n"
         "WHERE m.ctid = due.ctid\nRETURNING")
# (a) The claim that deletes: the same rows, taken the same way (FOR UPDATE SKIP LOCKED, the ordering
# check), deleted instead, in a transaction the firer keeps open until Kafka acknowledged them, then
# commits; a failed publish rolls back and the rows are back untouched. A peer's claim skips them while
# the transaction holds them; PostgreSQL ends the transaction of a firer that hangs or is cut off
# (idle_in_transaction_session_timeout), and its rows are back.
TAKE = "DELETE FROM chronos_messages AS m\nUSING due\nWHERE m.ctid = due.ctid\nRETURNING"
# What PostgreSQL ends a firer's held transaction after, when the firer goes silent inside it.
HELD_SESSION = f"SET idle_in_transaction_session_timeout = {HOLD_TIME_MS}"
# The detector of a design with no in-flight rows: nothing to reset, only sessions idle in a transaction
# longer than the hold time to report (PostgreSQL ends them itself).
STALE_SESSIONS = ("SELECT pid, usename, client_addr FROM pg_stat_activity WHERE datname = current_database() "
                  "AND state = 'idle in transaction' AND state_change < now() - %(hold_ms)s * interval '1 millisecond'")

# (b) No row lock for the rows a firer owns by its lease: it reads its own slices' due rows with a plain
# SELECT (the claim of slices with neither FOR UPDATE nor the stamp), publishes them and deletes them by
# TID once Kafka acknowledged them: no row version but the delete's. It leaves out the rows it read
# before and still holds (their TIDs, `%(held)s`: a row replaced since has a new TID and is read again).
LEASE_HELD = ("AND deadline <= now() + %(lookahead_ms)s * interval '1 millisecond'",
              "AND deadline <= now() + %(lookahead_ms)s * interval '1 millisecond'\n"
              "          AND ctid NOT IN (SELECT unnest(%(held)s::tid[]))")
LEASE_READ = "SELECT"
LEASE_FROM = "\nFROM chronos_messages AS m JOIN due ON m.ctid = due.ctid"
LEASE_DELETE = ("DELETE FROM chronos_messages AS m USING unnest(%(ctids)s::tid[], %(ids)s::text[]) AS f(ctid, id) "
                "WHERE m.ctid = f.ctid AND m.id IS NOT DISTINCT FROM f.id")

# (c) Fewer index entries per row, each measured apart, with today's claim:
# the index of the key's hash, which the schema has only where an operator builds it (`chronos key-search on`):
# what it costs every write;
KEY_INDEX = ("CREATE INDEX chronos_messages_key_hash ON chronos_messages (hashtext(encode(key, 'hex'))) "
             "WHERE key IS NOT NULL AND readied_at IS NULL",)
# the primary key on the enqueue order (a sequence: every insert lands on the right-most leaf) instead of
# the random text id; the id gets a hash index (4 bytes an entry) for cancel, replace and show, and the
# consumer asks it for the batch's ids before the COPY (PRECHECK): idempotency by lookup, not by a unique
# index;
PK_SEQ = ("ALTER TABLE chronos_messages DROP CONSTRAINT chronos_messages_pkey",
          "ALTER TABLE chronos_messages ADD PRIMARY KEY (seq)",
          "CREATE INDEX chronos_messages_id ON chronos_messages USING hash (id)")
PRECHECK = "SELECT id FROM chronos_messages WHERE id = ANY(%(ids)s::text[])"
# the primary key on (deadline, id): a message read again (same id, same deadline) still conflicts, and
# inserts land where the deadlines of the next seconds are instead of anywhere; the id's hash index for
# cancel, replace and show.
PK_DEADLINE = ("ALTER TABLE chronos_messages DROP CONSTRAINT chronos_messages_pkey",
               "ALTER TABLE chronos_messages ADD PRIMARY KEY (deadline, id)",
               "CREATE INDEX chronos_messages_id ON chronos_messages USING hash (id)")

# (d) Deadline-bucketed tables, PgQ's rotation: one table per `--bucket-s` of deadlines, `--buckets` of
# them in turn; rows are written to the table of their deadline's bucket (here, where every row is due
# when written, the bucket of the time of writing), claimed from the oldest bucket first with the claim
# that deletes, and a bucket whose time has passed is emptied by TRUNCATE, under a lock taken without
# waiting, once it holds no row: no vacuum of the rows it held, nor of their index entries.
BUCKET = "chronos_bucket_{}"
BUCKETS, BUCKET_S = 8, 1.0


def bucket_schema(count: int) -> tuple[str, ...]:
    return tuple(f"CREATE TABLE {BUCKET.format(b)} (LIKE chronos_messages INCLUDING ALL) WITH (fillfactor = 80)"
                 for b in range(count))


# (e) Lean: the claim that deletes by slices, and only the indexes it needs: the primary key and the due index
# (no in-flight index: no row is ever in flight in the table; the schema has no key hash index). And the lease's
# read on that schema: the claim that deletes still writes a lock record per row (FOR UPDATE, so that a peer's
# claim skips the row) beside its delete, the lease's read none.
LEAN = ("DROP INDEX chronos_messages_readied",)


def transformed(statement: str, old: str, new: str) -> str:
    """`statement` with its one `old` part replaced by `new`: a candidate made from today's statement, which
    fails here, loudly, once today's statement no longer has that part."""
    if statement.count(old) != 1:
        raise ValueError(f"today's statement no longer has {old!r} once")
    return statement.replace(old, new)


def taking(name: str) -> str:
    """Today's claim `name` as a claim that deletes (a)."""
    return transformed(QUERIES[name], STAMP, TAKE)


def leasing(name: str) -> str:
    """Today's claim of slices `name` as a plain read of the firer's own slices (b)."""
    statement = transformed(QUERIES[name], "FOR UPDATE SKIP LOCKED", "")
    statement = transformed(statement, *LEASE_HELD)
    return transformed(statement, STAMP, LEASE_READ) + LEASE_FROM


# The claim, its RETURNING folded into text arrays the delete takes back unchanged; a full one, and one of
# recent deadlines only, taken in turn as the firer takes them (`Claimer.claim_rows`).
# The fifth column is the deadline of the oldest row the claim took (epoch µs, NULL for none: whether a full claim
# follows at once is the firer's `full_claim_again`), the sixth how many rows it took before their deadline (within
# the lookahead: none where every row is written due).
CLAIMED = "id, deadline_us, topic, key, value, headers, readied_at, seq, attempts, original_us, ctid"


def folded(statement: str, columns: str = CLAIMED) -> str:
    """The claim `statement` (a name of QUERIES, or the statement itself, whose RETURNING gives `columns`)
    folded into one row."""
    statement = QUERIES.get(statement, statement)
    return (f"WITH claimed ({columns}) AS ({statement}) "
            "SELECT count(*), array_agg(ctid)::text, array_agg(id)::text, array_agg(readied_at)::text, "
            "min(deadline_us), count(*) FILTER (WHERE deadline_us > extract(epoch FROM now()) * 1000000) "
            "FROM claimed")


def full_again(count: int, oldest_us: int | None) -> bool:
    """Whether a full claim of `count` rows, the oldest due at `oldest_us`, is followed by another at once, as the
    firer decides it (`full_claim_again`)."""
    return full_claim_again(None if oldest_us is None else oldest_us / 1e6, count == BATCH, time.time(),
                            RECENT_WINDOW_MS / 1000.0)


CLAIM, CLAIM_RECENT = folded("claim"), folded("claim_recent")
# The claim of a firer's own slices (`--claims shares`, as Chronos's firers claim beside each other).
CLAIM_SHARE, CLAIM_SHARE_RECENT = folded("claim_share"), folded("claim_share_recent")
TAKE_ALL, TAKE_RECENT = folded(taking("claim")), folded(taking("claim_recent"))
TAKE_SHARE, TAKE_SHARE_RECENT = folded(taking("claim_share")), folded(taking("claim_share_recent"))
LEASE, LEASE_RECENT = folded(leasing("claim_share")), folded(leasing("claim_share_recent"))


@dataclass(frozen=True)
class Variant:
    """One design of the hot path's statements: how a firer claims and settles (`firer`), whether firers claim
    their own slices (`shares`), the schema's changes, and the variant of today's statements it is set against
    (`baseline`; None: it is one)."""
    name: str
    doc: str
    firer: str = "update"  # update: claim, then delete; delete: the claim that deletes; lease; buckets
    shares: bool = False
    baseline: str | None = None
    schema: tuple[str, ...] = ()
    find_stale: str | None = QUERIES["find_stale"]
    precheck: str | None = None

    def claims(self) -> tuple[str, str]:
        """(the full claim, the claim of recent deadlines), folded."""
        if self.firer == "lease":
            return LEASE, LEASE_RECENT
        if self.firer in ("delete", "buckets"):
            return (TAKE_SHARE, TAKE_SHARE_RECENT) if self.shares else (TAKE_ALL, TAKE_RECENT)
        return (CLAIM_SHARE, CLAIM_SHARE_RECENT) if self.shares else (CLAIM, CLAIM_RECENT)

    def settle(self) -> str | None:
        """The statement that deletes a batch once Kafka acknowledged it (None: the commit does)."""
        return {"update": QUERIES["delete_fired"], "lease": LEASE_DELETE}.get(self.firer)

    def tables(self, buckets: int = BUCKETS) -> tuple[str, ...]:
        return tuple(BUCKET.format(b) for b in range(buckets)) if self.firer == "buckets" else (TABLE,)

    def ddl(self, buckets: int = BUCKETS) -> tuple[str, ...]:
        return self.schema + (bucket_schema(buckets) if self.firer == "buckets" else ())


VARIANTS = {v.name: v for v in (
    Variant("today", "today's statements: the claim stamps the due rows as the firer's (UPDATE ... RETURNING, FOR "
                     "UPDATE SKIP LOCKED), every firer racing for all of them; the delete by TID once Kafka "
                     "acknowledged them; the detector's scan of the in-flight index"),
    Variant("today-shares", "today's statements, each firer claiming its own slices off the due index, as "
                            "Chronos's firers do beside each other", shares=True),
    Variant("delete-claim", "(a) the claim that deletes: the due rows taken with today's claim, DELETE ... RETURNING "
                            "instead of the stamp, in a transaction held until Kafka acknowledged them (--hold-ms), "
                            "then committed; a firer runs a session per batch in flight (--sessions); the firers "
                            "racing; the detector only reports sessions idle in a transaction past the hold time",
            firer="delete", baseline="today", find_stale=STALE_SESSIONS),
    Variant("delete-claim-shares", "(a) the claim that deletes, each firer taking its own slices",
            firer="delete", shares=True, baseline="today-shares", find_stale=STALE_SESSIONS),
    Variant("lease", "(b) no row lock for the rows a firer owns by its lease: a plain SELECT of its own slices' "
                     "due rows (leaving out those it holds), then a DELETE by TID once Kafka acknowledged them; "
                     "no detector statement (the leases hand a silent firer's slices over)",
            firer="lease", shares=True, baseline="today-shares", find_stale=None),
    Variant("key-index", "(c) today's statements with the key's hash index (chronos key-search on)", baseline="today",
            schema=KEY_INDEX),
    Variant("pk-seq", "(c) the primary key on the enqueue order (seq, right-most inserts) instead of the text id; "
                      "a hash index on the id, which the consumer looks the batch's ids up in before its COPY",
            baseline="today", schema=PK_SEQ, precheck=PRECHECK),
    Variant("pk-deadline", "(c) the primary key on (deadline, id) instead of the id; a hash index on the id",
            baseline="today", schema=PK_DEADLINE),
    Variant("buckets", "(d) deadline-bucketed tables (--buckets tables of --bucket-s each, in turn), the claim that "
                       "deletes from the oldest first, a bucket emptied by TRUNCATE once drained",
            firer="buckets", baseline="today", find_stale=STALE_SESSIONS),
    Variant("lean", "(e) the claim that deletes by slices on a schema with only the indexes it needs: the primary "
                    "key and the due index (no in-flight or key index)",
            firer="delete", shares=True, baseline="today-shares", schema=LEAN, find_stale=STALE_SESSIONS),
    Variant("lean-lease", "(e) the lease's plain read of a firer's own slices and its delete by TID, on the lean "
                          "schema: no row lock, no second row version, two index entries per row",
            firer="lease", shares=True, baseline="today-shares", schema=LEAN, find_stale=None),
)}


def legacy_variant(schema: str, claims: str) -> Variant:
    """Today's statements on one of SCHEMAS (`--schema`), racing or by slices (`--claims`)."""
    base = VARIANTS["today-shares" if claims == "shares" else "today"]
    return replace(base, schema=SCHEMAS[schema], find_stale=HOT_FIND_STALE if schema == "hot" else base.find_stale)


def ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def cpu_of(pids: list[int], reaped: int | None = None) -> float:
    """CPU seconds (user + system) of the processes still alive, and of the children that process `reaped` has
    waited for (the postmaster's: backends and autovacuum workers that ended count with it once they end)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if pid == reaped else 0)
    return total / ticks()


def server_cpu(postmaster: int) -> float:
    """CPU seconds of every process of the server so far, those that ended included."""
    return cpu_of(server_pids(postmaster), reaped=postmaster)


def server_pids(postmaster: int) -> list[int]:
    """The postmaster and its children: every process of the server."""
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class Batch(NamedTuple):
    stream: bytes  # a binary COPY stream of BATCH rows
    ids: str  # their ids, as a PostgreSQL text array


def copy_batches(count: int, run: str, ids: str = "sequential", due_us: int | None = None,
                 spread_us: int = 0) -> list[Batch]:
    """`count` batches of BATCH rows each, ids unique across them (`sequential`: run-batch-row, as the SLA
    harness's load numbers its messages; `uuid`: random, as producers' ids often are), due at `due_us`
    (default: a second ago) or, with `spread_us`, spread evenly over that many microseconds from it, the
    batches' rows in turn (each batch holds rows due first and last)."""
    headers = codec.encode_headers(APP_HEADERS)
    due = int(time.time() * 1e6) - 1_000_000 if due_us is None else due_us
    batches = []
    for k in range(count):
        names = ([str(uuid.uuid4()) for _ in range(BATCH)] if ids == "uuid"
                 else [f"{run}-{k}-{i}" for i in range(BATCH)])
        rows = [Row(name, due + (i * count + k) * spread_us // (BATCH * count) if spread_us else due, None,
                    b"key-%d" % i, VALUE, headers) for i, name in enumerate(names)]
        batches.append(Batch(codec.copy_rows(rows), "{" + ",".join(names) + "}"))
    return batches


def copy_streams(count: int, run: str) -> list[bytes]:
    """`count` binary COPY streams of BATCH rows each, due at once, ids unique across them."""
    return [batch.stream for batch in copy_batches(count, run)]


def firer_session(conn: psycopg.Connection, held: bool = False) -> None:
    """A firer's session settings (`held`: a session that holds a claim's transaction open)."""
    conn.execute(QUERIES["hot_path_settings"])
    conn.execute(QUERIES["async_commit"])
    if held:
        conn.execute(HELD_SESSION)
    if not conn.autocommit:
        conn.commit()


def text_array(arrays: list[str]) -> str:
    """PostgreSQL text arrays joined into one."""
    return "{" + ",".join(a[1:-1] for a in arrays if len(a) > 2) + "}"


class Drive:
    """The threads of one layout on one database, and their counts."""

    def __init__(self, url: str, consumers: int, firers: int, detectors: int, backlog: int, streams: list[bytes],
                 find_stale: str | None = None, rate: float | None = None, shares: bool = False, *,
                 variant: Variant | None = None, hold_ms: float = 0.0, sessions: int = MAX_HELD_BATCHES,
                 lookahead_ms: int = LOOKAHEAD_MS, once: bool = False, record: bool = False,
                 stream_ids: list[str] | None = None, buckets: int = BUCKETS, bucket_s: float = BUCKET_S):
        """`shares`: the firers divide the slices between them (`slices_of`, their nodes made here) and each
        claims its own, as Chronos's firers do; else each claims from all the due rows (a `variant` says it
        itself). A firer settles a batch `hold_ms` after its claim. `once`: the writers write each stream
        once, then stop; `record`: each settled batch's ids are kept (`taken`)."""
        self.variant = variant or VARIANTS["today-shares" if shares else "today"]
        if find_stale is not None:
            self.variant = replace(self.variant, find_stale=find_stale)
        self.url, self.backlog, self.streams = url, backlog, streams
        self.stream_ids = stream_ids
        self.hold_s, self.sessions, self.lookahead_ms = hold_ms / 1000.0, sessions, lookahead_ms
        self.once, self.record = once, record
        self.buckets, self.bucket_s = buckets, bucket_s
        self.nodes = [uuid.uuid4() for _ in range(firers)]
        self.shares = self.variant.shares
        if self.variant.precheck and stream_ids is None:
            raise ValueError(f"{self.variant.name}: the consumer's look-up needs the streams' ids")
        # with a rate, the writers together COPY a batch every BATCH / rate seconds, on a shared schedule
        self.every = None if rate is None else BATCH / rate
        self.next_copy = time.monotonic()
        self.inserted = self.deleted = self.claimed = self.claims = self.early = 0
        self.sessions_max = self.session_waits = self.truncates = self.found_waiting = 0
        self.taken: list[str] = []  # with `record`: each settled batch's ids, as PostgreSQL's text arrays
        self.dirty = [False] * buckets  # buckets written since they were last emptied
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.errors: list[str] = []
        fire = {"update": self.fire, "lease": self.fire, "delete": self.fire_held, "buckets": self.fire_held}
        self.threads = ([threading.Thread(target=self.guard, args=(self.write, k), daemon=True) for k in range(consumers)]
                        + [threading.Thread(target=self.guard, args=(fire[self.variant.firer], k), daemon=True)
                           for k in range(firers)]
                        + [threading.Thread(target=self.guard, args=(self.detect, k), daemon=True)
                           for k in range(detectors)])
        self.next_stream = 0

    def guard(self, body: Callable[[int], None], k: int) -> None:
        try:
            body(k)
        except Exception as exc:  # noqa: BLE001 - the run reports it and stops
            self.errors.append(f"{getattr(body, '__name__', body)} {k}: {exc}")
            self.halt.set()

    def bucket_now(self) -> int:
        return int(time.time() / self.bucket_s) % self.buckets

    def write(self, _k: int) -> None:
        copy_table = {t: QUERIES["copy_messages"].replace(TABLE, t) for t in self.variant.tables(self.buckets)}
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.halt.is_set():
                if self.inserted - self.deleted > self.backlog:
                    time.sleep(0.0005)
                    continue
                with self.lock:
                    if self.once and self.next_stream >= len(self.streams):
                        return
                    index = self.next_stream % len(self.streams)
                    self.next_stream += 1
                    at = self.next_copy
                    if self.every is not None:
                        self.next_copy = max(self.next_copy, time.monotonic() - 1.0) + self.every
                    table = TABLE
                    if self.variant.firer == "buckets":
                        bucket = self.bucket_now()
                        self.dirty[bucket] = True
                        table = BUCKET.format(bucket)
                if self.every is not None and at > time.monotonic():
                    time.sleep(at - time.monotonic())
                with conn.transaction():
                    if self.variant.precheck and self.stream_ids is not None:
                        found = conn.execute(self.variant.precheck, {"ids": self.stream_ids[index]}, prepare=True).fetchall()
                        self.found_waiting += len(found)
                    with conn.cursor() as cur, cur.copy(copy_table[table]) as copy:
                        copy.write(self.streams[index])
                with self.lock:
                    self.inserted += BATCH

    def claim_params(self, node: uuid.UUID) -> dict:
        params: dict = {"node": node, "limit": BATCH, "lookahead_ms": self.lookahead_ms, "window_ms": RECENT_WINDOW_MS,
                        "held": "{}"}
        if self.shares:
            mine = slices_of(node, [n for n in self.nodes if n != node]) or tuple(range(SLICES))
            params["low"], params["high"], params["mask"] = slice_span(mine)
        return params

    def counted(self, count: int, early: int) -> None:
        with self.lock:
            self.claims += 1
            self.claimed += count
            self.early += early

    def settled(self, count: int, ids: str) -> None:
        with self.lock:
            self.deleted += count
            if self.record:
                self.taken.append(ids)

    def wait_hold(self, claimed_at: float) -> None:
        """Until Kafka would have acknowledged a batch claimed at `claimed_at` (monotonic)."""
        wait = claimed_at + self.hold_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def fire(self, k: int) -> None:
        """A firer of today's claim (update) or of the lease's read: claims on one session, settles on another."""
        node = self.nodes[k]
        held: dict[int, str] = {}  # lease: the TIDs of the batches read and not yet deleted
        settling: queue.SimpleQueue = queue.SimpleQueue()
        deleter = threading.Thread(target=self.guard, args=(lambda _k: self.delete(settling, node, held), k), daemon=True)
        deleter.start()
        claim, claim_recent = self.variant.claims()
        with psycopg.connect(self.url, autocommit=True) as conn:
            firer_session(conn)
            params = self.claim_params(node)
            next_full, number = 0.0, 0
            while not self.halt.is_set():
                full = time.monotonic() >= next_full
                if self.variant.firer == "lease":
                    with self.lock:
                        params["held"] = text_array(list(held.values()))
                count, ctids, ids, readied, oldest, early = conn.execute(claim if full else claim_recent, params,
                                                                         prepare=True).fetchone()
                claimed_at = time.monotonic()
                if full:  # as the firer: another full claim at once when its rule says so
                    next_full = claimed_at + (0 if full_again(count, oldest) else FULL_CLAIM_EVERY)
                self.counted(count, early)
                if count:
                    number += 1
                    if self.variant.firer == "lease":
                        with self.lock:
                            held[number] = ctids
                    settling.put((claimed_at, number, count, ctids, ids, readied))
                if count < BATCH:  # as the firer paces itself: at once again only while a claim comes back full
                    time.sleep(POLL_S)
        settling.put(None)
        deleter.join(15 + self.hold_s)

    def delete(self, settling: queue.SimpleQueue, node: uuid.UUID, held: dict[int, str]) -> None:
        statement = self.variant.settle()
        assert statement is not None
        with psycopg.connect(self.url, autocommit=True) as conn:
            firer_session(conn)
            while True:
                item = settling.get()
                if item is None:
                    return
                claimed_at, number, count, ctids, ids, readied = item
                self.wait_hold(claimed_at)
                cur = conn.execute(statement, {"ctids": ctids, "ids": ids, "readied_at": readied, "node": node},
                                   prepare=True)
                with self.lock:
                    held.pop(number, None)
                self.settled(cur.rowcount, ids)

    def fire_held(self, k: int) -> None:
        """A firer of the claim that deletes (a, d): each claim in a transaction of its own, on a session of its
        own, committed by `commit_held` once Kafka would have acknowledged the batch."""
        node = self.nodes[k]
        free: queue.SimpleQueue = queue.SimpleQueue()
        held: queue.SimpleQueue = queue.SimpleQueue()
        conns = [psycopg.connect(self.url) for _ in range(self.sessions)]
        busy = [0]
        try:
            for conn in conns:
                firer_session(conn, held=True)
                free.put(conn)
            committer = threading.Thread(target=self.guard, args=(lambda _k: self.commit_held(held, free, busy), k),
                                         daemon=True)
            committer.start()
            claim, claim_recent = self.variant.claims()
            claims = []
            if self.variant.firer == "buckets":
                claims = [(claim.replace(TABLE, BUCKET.format(b)), claim_recent.replace(TABLE, BUCKET.format(b)))
                          for b in range(self.buckets)]
            params = self.claim_params(node)
            next_full = 0.0
            drained = [0.0] * self.buckets  # buckets: when this firer last found one empty (monotonic)
            while not self.halt.is_set():
                try:
                    conn = free.get_nowait()
                except queue.Empty:
                    with self.lock:
                        self.session_waits += 1
                    try:
                        conn = free.get(timeout=0.5)
                    except queue.Empty:
                        continue
                with self.lock:
                    busy[0] += 1
                    self.sessions_max = max(self.sessions_max, busy[0])
                full = time.monotonic() >= next_full
                if self.variant.firer == "buckets":
                    count, ids, oldest, early = self.take_buckets(conn, claims, params, full, drained)
                else:
                    count, _ctids, ids, _readied, oldest, early = conn.execute(claim if full else claim_recent, params,
                                                                               prepare=True).fetchone()
                claimed_at = time.monotonic()
                if full:
                    next_full = claimed_at + (0 if full_again(count, oldest) else FULL_CLAIM_EVERY)
                self.counted(count, early)
                if count:
                    held.put((claimed_at, conn, count, ids))
                else:
                    conn.rollback()
                    with self.lock:
                        busy[0] -= 1
                    free.put(conn)
                if count < BATCH:
                    time.sleep(POLL_S)
            held.put(None)
            committer.join(15 + self.hold_s)
        finally:
            for conn in conns:
                conn.close()

    def take_buckets(self, conn: psycopg.Connection, claims: list[tuple[str, str]], params: dict, full: bool,
                     drained: list[float]) -> tuple[int, str, int | None, int]:
        """One claim pass over the buckets, oldest first, in one transaction: (rows, their ids, the oldest row's
        deadline, early). A bucket this firer found empty, and whose time has passed, it leaves alone for FULL_CLAIM_EVERY, so its
        transactions do not keep the bucket's TRUNCATE waiting."""
        now, total, oldest_all, early_all, ids = self.bucket_now(), 0, None, 0, []
        for step in range(1, self.buckets + 1):
            b = (now + step) % self.buckets
            if b != now and time.monotonic() < drained[b] + FULL_CLAIM_EVERY:
                continue
            params["limit"] = BATCH - total
            count, _ctids, taken, _readied, oldest, early = conn.execute(claims[b][0 if full else 1], params,
                                                                         prepare=True).fetchone()
            if not count and b != now:
                drained[b] = time.monotonic()
            total, early_all = total + count, early_all + early
            oldest_all = oldest if oldest_all is None or (oldest is not None and oldest < oldest_all) else oldest_all
            if count:
                ids.append(taken)
            if total >= BATCH:
                break
        params["limit"] = BATCH
        return total, text_array(ids), oldest_all, early_all

    def commit_held(self, held: queue.SimpleQueue, free: queue.SimpleQueue, busy: list[int]) -> None:
        while True:
            item = held.get()
            if item is None:
                return
            claimed_at, conn, count, ids = item
            self.wait_hold(claimed_at)
            conn.commit()
            self.settled(count, ids)
            with self.lock:
                busy[0] -= 1
            free.put(conn)

    def detect(self, k: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(QUERIES["hot_path_settings"])
            rotate = self.variant.firer == "buckets" and k == 0
            period = 0.1 if rotate else 0.5
            next_scan = time.monotonic() + 0.5
            while not self.halt.wait(period):
                if rotate:
                    self.rotate(conn)
                if self.variant.find_stale is not None and time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + 0.5
                    conn.execute(self.variant.find_stale, {"hold_ms": HOLD_TIME_MS, "limit": 10000}).fetchall()

    def rotate(self, conn: psycopg.Connection) -> None:
        """Empty every bucket written since it was last emptied, other than the one written now, that holds no
        row: under an ACCESS EXCLUSIVE lock, taken only if no transaction holds the bucket (NOWAIT: a queued
        lock would hold every claim of the bucket back), the bucket is read for a row and truncated if it has
        none (a writer's COPY that waited for the lock then writes into the empty table)."""
        now = self.bucket_now()
        for b in range(self.buckets):
            if b == now or not self.dirty[b]:
                continue
            try:
                with conn.transaction():
                    conn.execute(f"LOCK TABLE {BUCKET.format(b)} IN ACCESS EXCLUSIVE MODE NOWAIT")
                    conn.execute("SET LOCAL enable_seqscan = on")
                    if conn.execute(f"SELECT EXISTS (SELECT FROM {BUCKET.format(b)})").fetchone()[0]:
                        continue
                    conn.execute(f"TRUNCATE {BUCKET.format(b)}")
                with self.lock:
                    self.truncates += 1
                    if b != self.bucket_now():
                        self.dirty[b] = False
            except psycopg.errors.LockNotAvailable:
                continue


# -- the measures --------------------------------------------------------------------------------------------

class Reading(NamedTuple):
    at: float  # monotonic
    cpu: float  # CPU seconds of every PostgreSQL process
    driver: float  # CPU seconds of this process
    lsn: str
    wal: tuple[int, int, int]  # pg_stat_wal: records, full-page images, bytes
    table: tuple[int, int, int, int, int]  # the variant's tables: inserts, updates, HOT updates, deletes, dead rows
    drive: tuple[int, int, int]  # inserted, deleted, claimed


READING = ("SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_fpi, w.wal_bytes::bigint, "
           "coalesce(sum(t.n_tup_ins), 0), coalesce(sum(t.n_tup_upd), 0), coalesce(sum(t.n_tup_hot_upd), 0), "
           "coalesce(sum(t.n_tup_del), 0), coalesce(sum(t.n_dead_tup), 0) "
           "FROM pg_stat_wal AS w LEFT JOIN pg_stat_user_tables AS t ON t.relname = ANY(%(tables)s) "
           "GROUP BY 1, 2, 3, 4")


def reading(conn: psycopg.Connection, postmaster: int, tables: tuple[str, ...], drive: Drive | None) -> Reading:
    """The server's counters now (the statistics of other sessions are published up to a second late, the same at
    both ends of a window)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    lsn, records, fpi, wal_bytes, *table = conn.execute(READING, {"tables": list(tables)}).fetchone()
    counts = (drive.inserted, drive.deleted, drive.claimed) if drive else (0, 0, 0)
    return Reading(time.monotonic(), server_cpu(postmaster), time.process_time(), lsn,
                   (int(records), int(fpi), int(wal_bytes)), tuple(int(v) for v in table), counts)  # type: ignore[arg-type]


# Index entries written, from the WAL's records by kind: each of these carries one index entry (a leaf split's
# record carries the entry whose insert split the page; an upper page's split, rare, is counted too).
INDEX_ENTRY_RECORDS = ("Btree/INSERT_LEAF", "Btree/INSERT_POST", "Btree/SPLIT_L", "Btree/SPLIT_R", "Hash/INSERT")
WAL_STATS = ('SELECT "resource_manager/record_type", count, combined_size FROM pg_get_wal_stats(%s, %s, true) '
             "WHERE count > 0")


def wal_records(conn: psycopg.Connection, start: str, end: str) -> dict[str, tuple[int, int]]:
    """The WAL's records between two LSNs by kind: (count, bytes)."""
    return {kind: (int(count), int(size)) for kind, count, size in conn.execute(WAL_STATS, (start, end)).fetchall()}


def per(value: float, messages: int, digits: int = 3) -> float | None:
    return round(value / messages, digits) if messages else None


def step_figures(variant: Variant, r0: Reading, r1: Reading, records: dict[str, tuple[int, int]],
                 vacuum: tuple[Reading, Reading] | None) -> dict:
    """A step's figures from the readings at the start and end of its window (and around its VACUUM)."""
    elapsed = r1.at - r0.at
    messages = r1.drive[1] - r0.drive[1]
    inserted = r1.table[0] - r0.table[0]
    updates, hot, deletes = (r1.table[i] - r0.table[i] for i in (1, 2, 3))
    pg = r1.cpu - r0.cpu
    wal = r1.wal[2] - r0.wal[2]
    entries = sum(records.get(kind, (0, 0))[0] for kind in INDEX_ENTRY_RECORDS)
    by_manager: dict[str, int] = {}
    for kind, (_count, size) in records.items():
        manager = kind.split("/")[0]
        by_manager[manager] = by_manager.get(manager, 0) + size
    by_size = sorted(records.items(), key=lambda item: -item[1][1])
    vacuum_cpu = vacuum_wal = 0.0
    if vacuum is not None:
        vacuum_cpu, vacuum_wal = vacuum[1].cpu - vacuum[0].cpu, vacuum[1].wal[2] - vacuum[0].wal[2]
    return {
        "seconds": round(elapsed, 1), "messages": messages, "rate_per_s": round(messages / elapsed),
        "postgres_cores": round(pg / elapsed, 3),
        "postgres_us_per_message": per(pg * 1e6, messages, 2),
        "vacuum_us_per_message": per(vacuum_cpu * 1e6, messages, 2) if vacuum else None,
        "postgres_us_per_message_with_vacuum": per((pg + vacuum_cpu) * 1e6, messages, 2),
        "wal_bytes_per_message": per(wal, messages, 1),
        "vacuum_wal_bytes_per_message": per(vacuum_wal, messages, 1) if vacuum else None,
        "wal_bytes_per_message_with_vacuum": per(wal + vacuum_wal, messages, 1),
        "wal_records_per_message": per(r1.wal[0] - r0.wal[0], messages),
        "wal_fpi_per_message": per(r1.wal[1] - r0.wal[1], messages),
        "wal_bytes_by_manager_per_message": {m: per(size, messages, 1) for m, size in sorted(by_manager.items())},
        "wal_records_per_message_by_kind": {kind: [per(count, messages), per(size, messages, 1)]
                                            for kind, (count, size) in by_size},
        "index_entries_per_message": per(entries, messages),
        "rows_inserted_per_message": per(inserted, messages),
        "dead_tuples_per_message": per(updates + deletes, inserted),  # per row inserted: counted alike, as late
        "hot_update_share": round(hot / updates, 3) if updates else None,
        "dead_tuples_left": vacuum[0].table[4] if vacuum else r1.table[4],
        "driver_cores": round((r1.driver - r0.driver) / elapsed, 3),
        "firer": variant.firer, "claim_mode": "shares" if variant.shares else "race",
    }


def vacuumed(conn: psycopg.Connection, tables: tuple[str, ...]) -> None:
    conn.execute(f"VACUUM {', '.join(tables)}")


def run_layout(url: str, postmaster: int, layout: str, duration: float, warmup: float, backlog: int,
               streams: list[bytes], schema: str = "current", rate: float | None = None, claims: str = "race", *,
               variant: Variant | None = None, hold_ms: float = 0.0, sessions: int = MAX_HELD_BATCHES,
               vacuum: str = "auto", stream_ids: list[str] | None = None, buckets: int = BUCKETS,
               bucket_s: float = BUCKET_S) -> dict:
    """One step: `variant` (or today's statements on `schema`, `claims`) in `layout` on the database at `url`."""
    variant = variant or legacy_variant(schema, claims)
    consumers, firers, detectors = LAYOUTS[layout]
    tables = variant.tables(buckets)
    with psycopg.connect(url, autocommit=True) as conn:  # what an earlier step left, whose ids come again
        conn.execute(f"TRUNCATE {', '.join(tables)}")
        conn.execute("CHECKPOINT")  # every step starts as far from a checkpoint (its full-page images alike)
    drive = Drive(url, consumers, firers, detectors, backlog, streams, rate=rate, variant=variant, hold_ms=hold_ms,
                  sessions=sessions, stream_ids=stream_ids, buckets=buckets, bucket_s=bucket_s)
    with psycopg.connect(url, autocommit=True) as conn:
        for t in drive.threads:
            t.start()
        time.sleep(warmup)
        if vacuum == "owed" and not drive.errors:
            vacuumed(conn, tables)  # the warm-up's dead rows are not the window's
        r0 = reading(conn, postmaster, tables, drive)
        drive.halt.wait(duration)
        r1 = reading(conn, postmaster, tables, drive)
        drive.halt.set()
        for t in drive.threads:
            t.join(20 + hold_ms / 1000.0)
        if drive.errors:
            raise RuntimeError(f"{variant.name} {layout}: " + "; ".join(drive.errors))
        around = None
        if vacuum == "owed":
            before = reading(conn, postmaster, tables, None)
            vacuumed(conn, tables)
            around = (before, reading(conn, postmaster, tables, None))
        inspected = time.monotonic()
        records = wal_records(conn, r0.lsn, r1.lsn)
        inspected = time.monotonic() - inspected
        left = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)
        # every row written was deleted once or is still there: else the variant lost or duplicated rows
        if drive.inserted != drive.deleted + left:
            raise RuntimeError(f"{variant.name} {layout}: {drive.inserted} rows written, {drive.deleted} deleted, "
                               f"{left} left: rows lost or deleted twice")
        conn.execute(f"TRUNCATE {', '.join(tables)}")
    row = {"layout": layout, "variant": variant.name, "baseline": variant.baseline, "schema": schema,
           "offered_rate": rate, "hold_ms": hold_ms, **step_figures(variant, r0, r1, records, around),
           "claims": drive.claims, "rows_read_again": drive.claimed - drive.deleted, "claimed_early": drive.early,
           "vacuum_s": round(around[1].at - around[0].at, 1) if around else None, "wal_inspect_s": round(inspected, 1)}
    if variant.firer in ("delete", "buckets"):
        row.update(sessions_max=drive.sessions_max, session_waits=drive.session_waits)
    if variant.firer == "buckets":
        row["truncates"] = drive.truncates
    if variant.precheck:
        row["found_waiting"] = drive.found_waiting
    return row


# -- a run: databases, rounds, the summary -------------------------------------------------------------------

TEMPLATE = "limit_template"
FIGURES = ("rate_per_s", "postgres_us_per_message", "postgres_us_per_message_with_vacuum", "wal_bytes_per_message",
           "wal_bytes_per_message_with_vacuum", "dead_tuples_per_message", "index_entries_per_message")


def database_name(variant: Variant) -> str:
    return "limit_" + variant.name.replace("-", "_")


def make_databases(server_url: str, variants: list[Variant], *, fillfactor: int | None, vacuum: str,
                   buckets: int) -> dict[str, str]:
    """A database per variant, cloned from one migrated template, with the variant's schema: their URLs."""
    from chronos.adapters.postgres.migrations import migrate
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    template = database_url_for(server_url, TEMPLATE)
    migrate(template)
    with psycopg.connect(template, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_walinspect")  # the WAL's records by kind
    urls = {}
    for variant in variants:
        name = database_name(variant)
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        urls[variant.name] = url = database_url_for(server_url, name)
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in variant.ddl(buckets):
                conn.execute(statement)
            for table in variant.tables(buckets):
                if fillfactor:
                    conn.execute(f"ALTER TABLE {table} SET (fillfactor = {int(fillfactor)})")
                if vacuum == "owed":
                    conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    return urls


def order_of(variants: list[Variant], round_: int) -> list[Variant]:
    """The variants in the order of round `round_`: turned by one each round, so none always follows another."""
    shift = round_ % len(variants)
    return variants[shift:] + variants[:shift]


def summarize(rows: list[dict]) -> list[dict]:
    """Per layout and variant: the medians of FIGURES over the rounds, and for a variant with a baseline the
    ratio of each figure to the baseline's of the same round and layout (a pair), with their median."""
    steps: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        steps.setdefault((row["layout"], row["variant"]), []).append(row)
    out = []
    for (layout, name), mine in steps.items():
        entry: dict = {"layout": layout, "variant": name, "baseline": mine[0]["baseline"], "steps": len(mine)}
        for figure in FIGURES:
            values = [r[figure] for r in mine if r.get(figure) is not None]
            entry[figure] = round(statistics.median(values), 3) if values else None
        base = steps.get((layout, mine[0]["baseline"] or ""), [])
        if base:
            by_round = {r["round"]: r for r in base}
            ratios: dict[str, list[float]] = {}
            for r in mine:
                b = by_round.get(r["round"])
                for figure in FIGURES:
                    if b is not None and r.get(figure) is not None and b.get(figure):
                        ratios.setdefault(figure, []).append(round(r[figure] / b[figure], 3))
            entry["ratios"] = {f: {"median": round(statistics.median(v), 3), "pairs": v} for f, v in ratios.items()}
        out.append(entry)
    return out


def variants_help() -> str:
    return "variants (--variants; the first two are today's statements):\n" + "\n".join(
        textwrap.fill(v.doc + (f" [set against {v.baseline}]" if v.baseline else ""), 100,
                      initial_indent=f"  {v.name:21}", subsequent_indent=" " * 23) for v in VARIANTS.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=variants_help(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), action="append", help="default: both")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per layout (default 30)")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--backlog", type=int, default=20_000, help="rows that may wait before writers pause")
    parser.add_argument("--rate", type=float, default=None,
                        help="messages per second the writers offer (default: as fast as the machine allows)")
    parser.add_argument("--schema", choices=sorted(SCHEMAS), default="current",
                        help="hot: no index on readied_at, so a claim may be a HOT update")
    parser.add_argument("--claims", choices=("race", "shares"), default="race",
                        help="race: every firer claims from all the due rows; shares: each claims its own slices, "
                             "as Chronos's firers do")
    parser.add_argument("--variants", type=lambda s: [v for v in s.split(",") if v], default=None,
                        help="comma-separated variants to run interleaved (listed below); instead of --schema and "
                             "--claims")
    parser.add_argument("--rounds", type=int, default=1, help="with --variants: how many times each runs in each layout")
    parser.add_argument("--hold-ms", type=float, default=0.0,
                        help="how long after its claim a firer settles a batch: Kafka's acknowledgement (default 0)")
    parser.add_argument("--sessions", type=int, default=MAX_HELD_BATCHES,
                        help="the claim that deletes: sessions per firer, one per batch in flight (default: the most "
                             f"batches a firer holds, {MAX_HELD_BATCHES})")
    parser.add_argument("--vacuum", choices=("auto", "owed"), default="auto",
                        help="auto: autovacuum as the server runs it; owed: autovacuum off for the steps' tables, a "
                             "VACUUM after the window counted with it")
    parser.add_argument("--ids", choices=("sequential", "uuid"), default="sequential",
                        help="the messages' ids: numbered, as the SLA harness's load, or random UUIDs")
    parser.add_argument("--buckets", type=int, default=BUCKETS, help=f"buckets: tables in turn (default {BUCKETS})")
    parser.add_argument("--bucket-s", type=float, default=BUCKET_S, help=f"buckets: seconds each (default {BUCKET_S:g})")
    parser.add_argument("--fillfactor", type=int, default=None, help="the table's fillfactor (the schema's: 80)")
    parser.add_argument("--note", default=None, help="a line the result file keeps (what else ran on the machine)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.variants is not None:
        unknown = [v for v in args.variants if v not in VARIANTS]
        if unknown or not args.variants:
            parser.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; see the list below --help")
        if args.schema != "current" or args.claims != "race":
            parser.error("--variants names whole designs: leave --schema and --claims out")
        variants = [VARIANTS[v] for v in args.variants]
    else:
        variants = [legacy_variant(args.schema, args.claims)]
    rows = []
    machine = report.machine_info()
    started = report.now_iso()
    with migrated_postgres("chronos-limit-") as pg:  # the server chronos up runs, with its durable settings
        urls = make_databases(pg.url, variants, fillfactor=args.fillfactor, vacuum=args.vacuum, buckets=args.buckets)
        batches = copy_batches(max(20, 8 * args.backlog // BATCH), uuid.uuid4().hex[:8], ids=args.ids)
        streams, stream_ids = [b.stream for b in batches], [b.ids for b in batches]
        for round_ in range(args.rounds if args.variants else 1):
            for layout in args.layout or sorted(LAYOUTS):
                for variant in order_of(variants, round_):
                    row = run_layout(urls[variant.name], pg.pid, layout, args.duration, args.warmup, args.backlog,
                                     streams, args.schema, args.rate, args.claims, variant=variant,
                                     hold_ms=args.hold_ms, sessions=args.sessions, vacuum=args.vacuum,
                                     stream_ids=stream_ids, buckets=args.buckets, bucket_s=args.bucket_s)
                    row.update(round=round_, at=report.now_iso())
                    rows.append(row)
                    print(orjson.dumps(row).decode(), flush=True)
    summary = summarize(rows) if args.variants else None
    if summary:
        for entry in summary:
            ratios = entry.get("ratios", {})
            print(f"{entry['layout']} {entry['variant']:20} " + "  ".join(
                f"{f}={entry[f]}" + (f" ({ratios[f]['median']}x)" if f in ratios else "") for f in FIGURES), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps({
            "date": time.strftime("%Y-%m-%d"), "started": started, "ended": report.now_iso(), "batch": BATCH,
            "backlog": args.backlog, "schema": args.schema, "claim_mode": args.claims, "fillfactor": args.fillfactor,
            "rate": args.rate, "variants": args.variants, "rounds": args.rounds if args.variants else None,
            "hold_ms": args.hold_ms, "sessions": args.sessions, "vacuum": args.vacuum, "ids": args.ids,
            "buckets": [args.buckets, args.bucket_s] if "buckets" in (args.variants or ()) else None,
            "note": args.note, "machine": {**machine, "loadavg_at_end": list(os.getloadavg())},
            "command": "python -m benchmarks.design_limit " + " ".join(argv or sys.argv[1:]),
            "code": report.code_version(), "rows": rows, "summary": summary}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
