"""The PostgreSQL store: every SQL path the processes use, and the migrations.

SQL lives in `sql/` beside this module: `queries.sql` holds named statements, `NNNN_*.sql` the versioned
schema. Driver errors are translated here into `StoreUnavailable` (connection trouble: retry)
so the processes never see psycopg's exception tree. Through a connection pooler in transaction mode a
store keeps no state on its connection between transactions (`pooling`).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextlib import AbstractContextManager, contextmanager
from importlib import resources
from typing import Any, Iterable, Iterator, Sequence

import psycopg

from chronos import codec, ports
from chronos.adapters.postgres import pooling
from chronos.adapters.postgres.connection import (DEADLINES, connect, connection_lost, refused,  # noqa: F401
                                                  server_of, short, translate)
from chronos.config import Settings, redact_url
from chronos.domain import cron, ratelimit, schedules
from chronos.domain.model import (DUE_CAP, ESTIMATE_ABOVE, Claimed, NodeLoad, Overview, Parked, Row, ServerView,
                                  Sessions, Stale, Standby, Throttled)
from chronos.errors import (SchemaError, StoreRefused, StoreRejected, StoreUnavailable,  # noqa: F401
                            UnavailableError, UnsupportedServer)

log = logging.getLogger("chronos.store")

_SQL_DIR = resources.files("chronos.adapters.postgres.sql")
_NAME_RE = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INCLUDE_RE = re.compile(r"/\* include: (\w+) \*/")
# Postgres advisory lock key that serialises concurrent `chronos migrate` runs.
_MIGRATE_LOCK = 0x6368726F6E6F73


# Statements that differ from another only in their topic filter are one body in queries.sql, with
# the filter's place marked: the claim and the token bucket's refill, for any topic, for one topic
# named by chronosTopic, and for the output topic (rows without one).
_TOPIC_MARK = "/* topic filter */"
_TOPIC_VARIANTS = {  # statement: (body, its topic filter)
    "claim": ("claim", ""),
    "claim_topic": ("claim", "AND topic = %(topic)s"),
    "claim_output_topic": ("claim", "AND topic IS NULL"),
    "take_tokens": ("take_tokens", "AND topic = %(topic)s"),
    "take_output_tokens": ("take_tokens", "AND topic IS NULL"),
}


def _load_queries() -> dict[str, str]:
    text = (_SQL_DIR / "queries.sql").read_text()
    parts = _NAME_RE.split(text)
    blocks = {(kind, name): body.strip().rstrip(";") for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3])}
    # a fragment is a piece of SQL several statements share, put where they say /* include: NAME */
    fragments = {name: "\n".join(line for line in body.splitlines() if not line.startswith("--"))
                 for (kind, name), body in blocks.items() if kind == "fragment"}
    queries = {name: _INCLUDE_RE.sub(lambda m: fragments[m.group(1)], body)
               for (kind, name), body in blocks.items() if kind == "name"}
    bodies = {body: queries[body] for body, _ in _TOPIC_VARIANTS.values()}
    for name, (body, topic_filter) in _TOPIC_VARIANTS.items():
        assert _TOPIC_MARK in bodies[body], f"queries.sql: {body} has no {_TOPIC_MARK} mark"
        queries[name] = bodies[body].replace(_TOPIC_MARK, topic_filter)
    return queries


QUERIES = _load_queries()


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration file, in order."""
    found = []
    for entry in _SQL_DIR.iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found)


LATEST_VERSION = migrations()[-1][0]


def text_array(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of text values, for a `%s::text[]` parameter. On the firer's
    hot path psycopg's list adapter cost 1 ms per 1,000 ids (and 3 ms per 1,000 timestamps);
    this costs 0.15 ms, and 0.05 ms when no value holds a quote or a backslash (the firer's ids
    and ctids, nearly always): joined and checked once, not escaped one by one."""
    values = list(values)
    if not values:
        return "{}"
    together = "".join(values)
    if '"' not in together and "\\" not in together:
        return '{"' + '","'.join(values) + '"}'
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def _claimed_params(rows: Sequence[Claimed], node: Any) -> dict[str, Any]:
    """(ctid, id, readied_at) triples as array literals. One claim stamps all its rows with one
    readied_at, so each distinct timestamp is formatted once."""
    stamps: dict[Any, str] = {}
    for r in rows:
        if r.readied_at not in stamps:
            stamps[r.readied_at] = r.readied_at.isoformat()
    return {"ctids": text_array(r.ctid for r in rows), "ids": text_array(r.id for r in rows),
            "readied_at": "{" + ",".join(stamps[r.readied_at] for r in rows) + "}", "node": node}


# The oldest PostgreSQL Chronos supports: the oldest its tests run against (Debian's PostgreSQL 15, beside
# the embedded 18). Older servers are refused by `chronos migrate` and by the processes at start.
MIN_SERVER_VERSION = 150000  # server_version_num


def check_server_version(conn: psycopg.Connection) -> None:
    """UnsupportedServer if the server is older than MIN_SERVER_VERSION."""
    version = conn.info.server_version
    if version < MIN_SERVER_VERSION:
        raise UnsupportedServer(f"PostgreSQL {version // 10000}.{version % 10000} is older than the oldest this "
                                f"chronos supports ({MIN_SERVER_VERSION // 10000}): upgrade the server")


def migrate(url: str) -> list[int]:
    """Apply every migration not yet applied; safe to run concurrently and repeatedly. A database already
    at the latest version is left untouched, so a role without the right to create tables (the one the
    processes run as) may run it too."""
    applied: list[int] = []
    try:
        # one transaction, nothing prepared: the same through a pooler in transaction mode
        with connect(url, autocommit=False, prepared=False) as conn:
            check_server_version(conn)
            with conn.transaction():
                conn.execute(QUERIES["migrate_lock"], {"lock": _MIGRATE_LOCK})
                exists = _one(conn.execute(QUERIES["has_schema_version"]))[0]
                current = _one(conn.execute(QUERIES["schema_version"]))[0] if exists else 0
                if current > LATEST_VERSION:
                    raise SchemaError(f"database schema is at version {current}, newer than this chronos "
                                      f"({LATEST_VERSION}): upgrade chronos")
                if current == LATEST_VERSION:
                    return []
                conn.execute(QUERIES["create_schema_version"])
                for version, name, text in migrations():
                    if version <= current:
                        continue
                    conn.execute(text)
                    conn.execute(QUERIES["record_migration"], {"version": version, "name": name})
                    applied.append(version)
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise StoreUnavailable(f"PostgreSQL at {redact_url(url)}: {short(exc, url)}") from None
    except psycopg.Error as exc:  # e.g. no right to create the table: a one-line error, not a traceback
        raise StoreRejected(f"migration failed: {short(exc, url)}") from None
    return applied


def _one(cursor: psycopg.Cursor) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (an aggregate, or a SELECT without FROM)."""
    row = cursor.fetchone()
    assert row is not None, "a single-row query returned no row"
    return row


def check_schema(conn: psycopg.Connection) -> None:
    """SchemaError unless the database is migrated to this chronos's version on a supported server."""
    try:
        _check_schema(conn)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(short(exc)) from None


def _check_schema(conn: psycopg.Connection) -> None:
    """check_schema, with the driver's errors left to the caller."""
    check_server_version(conn)
    exists = _one(conn.execute(QUERIES["has_schema_version"]))[0]
    current = _one(conn.execute(QUERIES["schema_version"]))[0] if exists else 0
    if current < LATEST_VERSION:
        raise SchemaError(f"database schema is at version {current}, this chronos needs {LATEST_VERSION}: "
                          f"run `chronos migrate` first")
    if current > LATEST_VERSION:
        raise SchemaError(f"database schema is at version {current}, newer than this chronos "
                          f"({LATEST_VERSION}): upgrade chronos")


# How long the pool mode probe may wait for PostgreSQL (through a pooler whose servers are all busy, it waits).
POOL_PROBE_DEADLINE_S = 10.0


def detect_pool_mode(url: str, *, deadline_s: float = POOL_PROBE_DEADLINE_S) -> str:
    """Whether `url` leads to PostgreSQL through a pooler in transaction mode (`pooling.TRANSACTION`) or not
    (`pooling.SESSION`), by `pooling.probe` on two connections of its own. StoreUnavailable (StoreRefused) when
    they cannot be had or PostgreSQL does not answer within `deadline_s`; ConfigError for a pooler in
    statement mode."""
    name = "chronos pool probe"
    with connect(url, application_name=name, prepared=False) as a, connect(url, application_name=name,
                                                                         prepared=False) as b:
        watches = [DEADLINES.arm(conn, deadline_s) for conn in (a, b)]
        try:
            return pooling.probe(a, b, lambda conn: _one(conn.execute(QUERIES["backend_pid"]))[0])
        except psycopg.Error as exc:
            if any(w.fired for w in watches):
                raise StoreUnavailable(f"PostgreSQL at {redact_url(url)} did not answer the pool mode probe within "
                                       f"{deadline_s:g}s") from None
            raise StoreUnavailable(f"probing PostgreSQL at {redact_url(url)} for a pooler: {short(exc, url)}") from None
        finally:
            for w in watches:
                DEADLINES.disarm(w)


def resolve_pool_mode(url: str, mode: str, *, check: bool = False) -> str:
    """The mode to talk to `url` in (`pooling`): `mode` itself when it is session or transaction, what the
    probe finds for auto. With `check` (`chronos up`, `chronos migrate`: before anything starts) session
    is probed too, and refused when the probe finds a pooler in transaction mode (PoolModeMismatch)."""
    if mode == pooling.TRANSACTION or (mode == pooling.SESSION and not check):
        return mode
    found = detect_pool_mode(url)
    if mode == pooling.SESSION and found == pooling.TRANSACTION:
        raise pooling.contradicted(redact_url(url))
    return found if mode == pooling.AUTO else mode


# How long a call of an operator's or a command's store may wait for PostgreSQL; the processes pass
# CHRONOS_DATABASE_TIMEOUT_MS instead.
DEFAULT_DEADLINE_S = 60.0

# Whether this libpq has pipeline mode (14 and later): through a pooler in transaction mode a statement and
# its settings then go in one round trip.
PIPELINE = psycopg.Pipeline.is_supported()


@contextmanager
def _begun(conn: psycopg.Connection, first: list[tuple[str, Any]]) -> Iterator[None]:
    """A transaction that runs `first` (statements and their parameters) before anything else, sent together
    where libpq has pipeline mode."""
    with conn.transaction():
        if len(first) > 1 and PIPELINE:
            with conn.pipeline():
                for query, params in first:
                    conn.execute(query, params)
        else:
            for query, params in first:
                conn.execute(query, params)
        yield


class Store:
    """One connection, reopened with backoff when it breaks. Not thread-safe: one per thread (only
    `cancel` may be called from another).

    Every call has a deadline (`deadline_s`): a server that has not answered by then is taken for hung,
    the connection is dropped (`connection.Deadlines`) and the call fails with StoreUnavailable, like
    any lost connection; the next call connects again, to whichever server of the URL is the primary
    then, the one that failed last. A connection that finds its server read-only (a standby, a demoted
    primary) is dropped the same way. `link` tells which server the store is connected to and how
    often it changed.

    `hot_path=True` for the processes' own stores (consumer, firer, detector): their connection
    gets the planner settings of `hot_path_settings`, which their statements are written for.
    `synchronous_commit=False` makes every session of this store commit without waiting for the
    WAL flush (for the firer, whose lost commits only fire a row again); the default keeps the
    server's setting (the consumer's inserts must be durable before its offsets are committed).

    `pool_mode` (CHRONOS_DATABASE_POOL_MODE) says how to talk through a connection pooler (`pooling`):
    `session` as to PostgreSQL itself; `transaction` with nothing prepared and the settings above made in
    each transaction; `auto` probes the URL when the store first connects. A store in session mode that
    finds out it is behind a pooler in transaction mode (a prepared statement or its staging table gone)
    raises PoolModeMismatch, a configuration error, never a StoreUnavailable to retry or a StoreRejected
    that would dead-letter data."""

    def __init__(self, url: str, *, node_id: uuid.UUID | None = None, hot_path: bool = False,
                 synchronous_commit: bool = True, deadline_s: float = DEFAULT_DEADLINE_S,
                 application_name: str = "chronos", pool_mode: str = pooling.SESSION):
        self.url = url
        self.node_id = node_id
        self.hot_path = hot_path
        self.synchronous_commit = synchronous_commit
        self.deadline_s = deadline_s
        self.application_name = application_name
        self.pool_mode = pool_mode
        # transaction_settings' parameters, for a transaction through a pooler in transaction mode; None: none to make
        self._settings: dict[str, str | None] | None = None
        if hot_path or not synchronous_commit:
            self._settings = {"planner": "off" if hot_path else None,
                              "synchronous_commit": None if synchronous_commit else "off"}
        self.conn: psycopg.Connection | None = None
        self.link = ports.Link()
        self._avoid: str | None = None  # the server the last connection failed on: tried last next time
        self._staging_ready = False
        self.last_ok = 0.0  # time.monotonic() of the last statement PostgreSQL answered (for /healthz)

    # -- connection management -------------------------------------------------------------

    @property
    def pooled(self) -> bool:
        """Whether this store talks to PostgreSQL through a pooler in transaction mode."""
        return self.pool_mode == pooling.TRANSACTION

    def open(self, *, check: bool = True) -> None:
        self.close()
        if self.pool_mode == pooling.AUTO:
            self.pool_mode = resolve_pool_mode(self.url, self.pool_mode)
        conn = connect(self.url, application_name=self.application_name, avoid=self._avoid, prepared=not self.pooled)
        self.conn, self._staging_ready = conn, False
        replaced = self.link.connected(server_of(conn))
        if replaced is not None:
            log.warning("connected to PostgreSQL at %s, another server than before (%s): a failover or a "
                        "switchover", self.link.server, replaced)

        def settle(conn: psycopg.Connection) -> None:
            if check:
                _check_schema(conn)
            if self.pooled:  # made in each transaction instead: see _execute and _transaction
                return
            if self.hot_path:
                conn.execute(QUERIES["hot_path_settings"])
            if not self.synchronous_commit:
                conn.execute(QUERIES["async_commit"])
        self._guarded(conn, settle)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error as exc:
                log.debug("closing a broken connection: %s", short(exc, self.url))
            self.conn = None
            self.link.lost()

    def cancel(self) -> None:
        """Cancel the statement running on this store's connection, if one is. The one method another
        thread than the store's own may call: psycopg's cancel is safe from any thread."""
        conn = self.conn
        if conn is None or conn.closed:
            return
        try:
            conn.cancel_safe(timeout=2.0)
        except psycopg.Error as exc:
            log.debug("cancelling a statement: %s", short(exc, self.url))

    def _c(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.open()
        assert self.conn is not None
        return self.conn

    def _guarded(self, conn: psycopg.Connection, fn, *args: Any) -> Any:
        """fn(conn, ...) within the store's deadline; a driver error comes out as the project's. A
        connection past its deadline, broken, or on a read-only server is closed: the next call opens
        another."""
        watch = DEADLINES.arm(conn, self.deadline_s)
        try:
            try:
                return fn(conn, *args)
            finally:
                DEADLINES.disarm(watch)  # before anything closes the connection: see Deadlines
        except psycopg.errors.TransactionRollback:
            raise  # the caller runs it again
        except psycopg.Error as exc:
            server = self.link.server
            if watch.fired:
                self.link.unanswered += 1
                self._lost(server)
                raise StoreUnavailable(f"PostgreSQL at {server} did not answer within {self.deadline_s:g}s: "
                                       f"connection dropped, the statement's outcome unknown") from None
            vanished = None if self.pooled else pooling.vanished(exc)
            if vanished is not None:
                self._lost(server)
                raise pooling.mismatch(server, vanished) from None
            error = translate(exc, self.url, server)
            if connection_lost(exc):
                if exc.sqlstate == "25006":
                    self.link.read_only += 1
                self._lost(server)
            raise error from None

    def _lost(self, server: str | None) -> None:
        self._avoid = server
        self.close()

    def _run(self, fn, *args: Any) -> Any:
        """Run fn(conn, ...) (see `_guarded`).

        A deadlock or serialization failure (concurrent writers of the same ids) rolled the whole
        transaction back: it is run again, a few times, before it counts as a failure."""
        for attempt in range(5):
            try:
                result = self._guarded(self._c(), fn, *args)
                break
            except psycopg.errors.TransactionRollback as exc:
                if attempt == 4:
                    raise StoreUnavailable(short(exc, self.url)) from None
                log.info("transaction rolled back (%s); running it again", short(exc, self.url))
                time.sleep(0.01 * (attempt + 1))
        self.last_ok = time.monotonic()
        return result

    def run(self, fn) -> Any:
        """Run fn(connection) with the store's reconnection and error translation (for chronos.ops.inspect)."""
        return self._run(fn)

    def _execute(self, conn: psycopg.Connection, query: str, params: Any = None, *,
                 prepare: bool | None = None) -> psycopg.Cursor:
        """conn.execute(query, params, prepare=prepare); through a pooler in transaction mode never prepared,
        and, outside a transaction, sent in one pipeline after the store's transaction_settings: one
        implicit transaction (the pipeline's one sync ends it) and one round trip (three, in an explicit
        transaction, where libpq has no pipeline mode: before 14). Its results are there when this returns."""
        if not self.pooled:
            return conn.execute(query, params, prepare=prepare)
        if self._settings is None or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return conn.execute(query, params)
        with conn.pipeline() if PIPELINE else conn.transaction():
            conn.execute(QUERIES["transaction_settings"], self._settings)
            cur = conn.execute(query, params)
        return cur

    def _transaction(self, conn: psycopg.Connection, *, settings: bool = True,
                     staging: bool = False) -> AbstractContextManager[Any]:
        """conn.transaction(); through a pooler in transaction mode it begins with the store's
        transaction_settings (unless `settings` is False: nothing in it is planned) and, with `staging`, the
        staging table, in one round trip."""
        if not self.pooled:
            return conn.transaction()
        first: list[tuple[str, Any]] = []
        if settings and self._settings:
            first.append((QUERIES["transaction_settings"], self._settings))
        if staging:
            first.append((QUERIES["create_staging_in_transaction"], None))
        return _begun(conn, first)

    # -- consumer --------------------------------------------------------------------------

    def insert(self, rows: Sequence[Row]) -> int:
        """Insert rows whose id is not waiting yet; returns how many were new."""
        return self.apply(rows, (), ())[0]

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row],
              cancels: Sequence[str]) -> tuple[int, int, int, int]:
        """One consumer batch in one transaction: COPY the inserts straight into the table (if an id
        is waiting already, the batch is written again with the inserts staged like the replaces,
        and only new ids inserted), COPY the replaces into the session's staging table and
        insert-or-replace from it, and cancel. Returns (inserted, replaced, cancelled,
        cancelled in flight): a cancelled row that a firer had already claimed is deleted all the
        same (nothing hands it back), but that firer may still publish it."""
        if not (inserts or replaces or cancels):
            return 0, 0, 0, 0

        def run(conn: psycopg.Connection) -> tuple[int, int, int, int]:
            if inserts:
                try:
                    return write(conn, direct=True)
                except psycopg.errors.UniqueViolation:
                    pass  # an id of the batch is waiting already: insert only the others, below
            return write(conn, direct=False)

        def write(conn: psycopg.Connection, direct: bool) -> tuple[int, int, int, int]:
            staged = (("u", replaces),) if direct else (("i", inserts), ("u", replaces))
            staging = bool(replaces) or not direct
            if staging and not self._staging_ready and not self.pooled:
                conn.execute(QUERIES["create_staging"])
                self._staging_ready = True
            inserted = replaced = cancelled = in_flight = 0
            # a batch of new ids only (the COPY, which has no plan) needs no settings
            with self._transaction(conn, settings=staging or bool(cancels), staging=staging):
                with conn.cursor() as cur:
                    if direct:
                        # the whole binary COPY stream built natively, handed over in one write: psycopg's
                        # write_row cost more per row than the rest of the consumer's batch path
                        with cur.copy(QUERIES["copy_messages"]) as copy:
                            copy.write(codec.copy_rows(inserts))
                        inserted = len(inserts)
                    if replaces or not direct:
                        with cur.copy(QUERIES["copy_staging_full"]) as copy:
                            copy.set_types(["text", "int8", "text", "bytea", "bytea", "bytea", "text", "text",
                                            "text", "text", "text"])
                            for op, rows in staged:
                                for r in rows:
                                    copy.write_row((r.id, r.deadline_us, r.topic, r.key, r.value, r.headers,
                                                    r.ordering_key, r.cron, r.timezone, op, r.dst_policy))
                    if inserts and not direct:
                        cur.execute(QUERIES["insert_from_staging"])
                        inserted = cur.rowcount
                    if replaces:
                        cur.execute(QUERIES["upsert_from_staging"])
                        replaced = cur.rowcount
                    if cancels:
                        claimed = [r[0] for r in cur.execute(QUERIES["cancel"], {"ids": list(cancels)})]
                        in_flight = sum(claimed)
                        cancelled = len(claimed) - in_flight
            return inserted, replaced, cancelled, in_flight
        return self._run(run)

    def waiting_ids(self, ids: Iterable[str]) -> set[str]:
        ids = list(ids)
        if not ids:
            return set()
        return self._run(lambda c: {r[0] for r in self._execute(c, QUERIES["waiting_ids"], {"ids": ids})})

    # -- firer -----------------------------------------------------------------------------

    def claim(self, limit: int, lookahead_ms: int) -> list[Claimed]:
        params = {"node": self.node_id, "limit": limit, "lookahead_ms": lookahead_ms}

        def run(conn: psycopg.Connection) -> list[Claimed]:
            cur = self._execute(conn, QUERIES["claim"], params, prepare=True)
            rows = [Claimed(*r) for r in cur.fetchall()]
            rows.sort(key=lambda r: (r.scheduled_us, r.seq))  # RETURNING has no order of its own
            return rows
        return self._run(run)

    def claim_limited(self, limits: ratelimit.FireRateLimits, output_topic: str, limit: int,
                      lookahead_ms: int) -> tuple[list[Claimed], bool]:
        """The claim when fire-rate limits are configured: topic by topic, each off its own index so
        a throttled backlog never delays another topic. A limited topic's rows are claimed once due
        (no lookahead: a token is spent when its message may go out) and no more of them than its
        bucket holds, taken in the claim's own transaction under the bucket's lock, so all firers
        together keep to the rate. Returns (rows in deadline order, whether a topic's share of the
        batch rather than its budget or its due rows ended its claim: a backlog to drain without
        sleeping)."""
        topics = self._run(lambda c: [r[0] for r in self._execute(c, QUERIES["waiting_topics"], prepare=True)])
        # One _run per topic: a transaction run again after a rollback repeats only its own topic.
        return ratelimit.claim_by_topic(
            limits, output_topic, topics, limit,
            lambda topic, share: self._run(lambda c: self._claim_topic(c, topic, share, lookahead_ms)),
            lambda name, topic, rate, share: self._run(lambda c: self._claim_granted(c, name, topic, rate, share)))

    def _claim_granted(self, conn: psycopg.Connection, name: str, topic: str | None, rate: float,
                       limit: int) -> list[Claimed]:
        """Claim as many due rows of one limited topic as its bucket allows, in one transaction."""
        with self._transaction(conn):
            bucket = self._execute(conn, QUERIES["take_output_tokens" if topic is None else "take_tokens"], {
                "topic": name, "rate": rate, "capacity": ratelimit.capacity(rate)}, prepare=True).fetchone()
            if bucket is None:  # nothing due
                return []
            grant = min(int(bucket[0]), limit)
            rows = self._claim_topic(conn, topic, grant, 0) if grant > 0 else []
            if rows:
                conn.execute(QUERIES["spend_tokens"], {"topic": name, "spent": len(rows)})
        return rows

    def _claim_topic(self, conn: psycopg.Connection, topic: str | None, limit: int,
                     lookahead_ms: int) -> list[Claimed]:
        query = QUERIES["claim_output_topic" if topic is None else "claim_topic"]
        params = {"node": self.node_id, "limit": limit, "lookahead_ms": lookahead_ms, "topic": topic}
        return [Claimed(*r) for r in self._execute(conn, query, params, prepare=True).fetchall()]

    def throttled(self, output_topic: str) -> list["Throttled"]:
        """Per topic the firers limit (their buckets in chronos_rate_limits): how many rows are due
        and not claimed, held back by the limit (at most DUE_CAP counted), and how late the oldest
        of them is, by the database clock."""
        def run(conn: psycopg.Connection) -> list[Throttled]:
            at = _one(self._execute(conn, QUERIES["db_now"]))[0]
            found = []
            for topic, rate in self._execute(conn, QUERIES["limited_topics"]).fetchall():
                output = topic == output_topic
                rows, oldest = _one(self._execute(conn, QUERIES["throttled_output_topic" if output else "throttled_topic"],
                                                  {"topic": topic, "cap": DUE_CAP}))
                found.append(Throttled(topic, rate, rows, max(0.0, (at - oldest).total_seconds()) if oldest else 0.0))
            return found
        return self._run(run)

    def claim_schedules(self, limit: int, lookahead_ms: int, now_us: int) -> list[Claimed]:
        """Fire due recurring schedules: in one transaction per call, create each due occurrence
        as a row claimed by this node and move the schedule to its next occurrence, so that with
        several firers, restarts and kills no occurrence is skipped or created twice.

        A schedule replaced after its occurrence was created (within the lookahead) is due again
        at that same time: that occurrence is not created again (the old version's stays the
        only one), the replacement applies from the next occurrence after it."""
        def run(conn: psycopg.Connection) -> list[Claimed]:
            claimed: list[Claimed] = []
            with self._transaction(conn):
                due = conn.execute(QUERIES["due_schedules"], {"limit": limit, "lookahead_ms": lookahead_ms})
                for (sid, deadline_us, expr, tz, topic, key, value, headers, okey, last_us, dst) in due.fetchall():
                    try:
                        step = schedules.step(sid, deadline_us, expr, tz, dst, headers, last_us, now_us)
                    except cron.CronError as exc:
                        log.error("recurring schedule %s has a bad expression (%s); cancelling it", sid, exc)
                        conn.execute(QUERIES["cancel"], {"ids": [sid]})
                        continue
                    occ = step.occurrence
                    if occ is not None:
                        row = conn.execute(QUERIES["insert_occurrence"], {
                            "id": occ.id, "deadline_us": occ.deadline_us, "topic": topic, "key": key,
                            "value": value, "headers": occ.headers, "ordering_key": okey,
                            "node": self.node_id}).fetchone()
                        if row is not None:
                            claimed.append(Claimed(*row))
                    conn.execute(QUERIES["advance_schedule"], {"id": sid, "next_us": step.next_us,
                                                               "last_us": occ.deadline_us if occ else None})
            return claimed
        return self._run(run)

    def list_schedules(self) -> list[tuple]:
        return self._run(lambda c: self._execute(c, QUERIES["list_schedules"]).fetchall())

    def delete_fired(self, done: Sequence[Claimed]) -> int:
        """Delete exactly these rows if this node still owns them as claimed; returns how many."""
        if not done:
            return 0
        params = _claimed_params(done, self.node_id)
        return self._run(lambda c: self._execute(c, QUERIES["delete_fired"], params, prepare=True).rowcount)

    def release(self, rows: Sequence[Claimed]) -> int:
        """Hand claimed rows back (unpublished, or their publish failed) so any firer takes them."""
        if not rows:
            return 0
        params = _claimed_params(rows, self.node_id)
        return self._run(lambda c: self._execute(c, QUERIES["release"], params).rowcount)

    def retry_later(self, failed: Sequence[tuple[Claimed, str, int]]) -> int:
        """Hand back rows whose publish was refused, each (row, error, delay_ms): the failure is
        counted and the row waits out its delay before any firer claims it again. Returns how many
        rows were still this node's."""
        if not failed:
            return 0
        params = _claimed_params([r for r, _, _ in failed], self.node_id)
        params.update(errors=[e for _, e, _ in failed], delay_ms=[d for _, _, d in failed])
        return self._run(lambda c: self._execute(c, QUERIES["retry_later"], params).rowcount)

    def park_claimed(self, rows: Sequence[tuple[Claimed, str]], output_topic: str) -> int:
        """Move claimed rows, each (row, reason), from the store to chronos_parked in one statement.
        Returns how many were still this node's (and so moved)."""
        if not rows:
            return 0
        params = _claimed_params([r for r, _ in rows], self.node_id)
        params.update(reasons=[reason for _, reason in rows], output_topic=output_topic)
        return self._run(lambda c: self._execute(c, QUERIES["park_claimed"], params).rowcount)

    def park(self, messages: Sequence[Parked]) -> None:
        """Keep messages no topic accepted, in one transaction."""
        if not messages:
            return

        def run(conn: psycopg.Connection) -> None:
            with self._transaction(conn), conn.cursor() as cur:
                cur.executemany(QUERIES["park_message"], [
                    {"message_id": m.message_id, "source": m.source, "topic": m.topic, "deadline": m.deadline,
                     "key": m.key, "value": m.value, "headers": m.headers, "reason": m.reason} for m in messages])
        self._run(run)

    def db_clock_us(self) -> int:
        return self._run(lambda c: _one(self._execute(c, QUERIES["db_clock"]))[0])

    # -- detector --------------------------------------------------------------------------

    def find_stale(self, hold_ms: int, limit: int = 10000) -> list[Stale]:
        return self._run(lambda c: [Stale(*r) for r in
                                    self._execute(c, QUERIES["find_stale"], {"hold_ms": hold_ms, "limit": limit})])

    def reset_stale(self, seen: Sequence[Stale]) -> list[uuid.UUID]:
        """Reset the rows whose readied_at/readied_by are still what the detector saw."""
        if not seen:
            return []
        params = {"ctids": text_array(s.ctid for s in seen), "ids": [s.id for s in seen],
                  "readied_at": [s.readied_at for s in seen], "readied_by": [s.readied_by for s in seen]}
        return self._run(lambda c: [r[0] for r in self._execute(c, QUERIES["reset_stale"], params)])

    # -- status and metrics ----------------------------------------------------------------

    def overview(self, hold_ms: int, *, exact: bool | None = None) -> "Overview":
        """What `chronos status` and the detector's gauges show, from cheap index-backed queries.

        The waiting count is exact below ESTIMATE_ABOVE rows (or with exact=True), else the
        planner's estimate; the due count stops at DUE_CAP. Tolerates schemas without recurring
        schedules (no `cron` column: a database migrated by an older chronos).
        """
        def run(conn: psycopg.Connection) -> Overview:
            execute = self._execute
            has_cron, estimate = _one(execute(conn, QUERIES["overview_features"]))
            nodes = [NodeLoad(*r) for r in execute(conn, QUERIES["overview_in_flight"], {"hold_ms": hold_ms})]
            count = exact if exact is not None else estimate < ESTIMATE_ABOVE
            at, first, next_deadline, waiting, due = _one(execute(
                conn, QUERIES["overview_waiting_cron" if has_cron else "overview_waiting"],
                {"exact": count, "due_cap": DUE_CAP}))
            schedules = _one(execute(conn, QUERIES["count_cron_schedules"]))[0] if has_cron else None
            parked = None
            if _one(execute(conn, QUERIES["has_parked"]))[0]:
                parked = _one(execute(conn, QUERIES["count_parked"]))[0]
            return Overview.build(at, first, next_deadline, waiting, estimate, due, nodes, schedules, parked)
        return self._run(run)

    def server_view(self) -> ServerView:
        """The server this store is connected to, as it sees itself (address, standby or primary,
        version), the servers replicating from it, and the Chronos processes with sessions on it (by
        their application name, `application_name`). For `chronos status` and the console; not part
        of `ports.Store`, which the roles use."""
        def run(conn: psycopg.Connection) -> ServerView:
            at, host, port, in_recovery, version = _one(conn.execute(QUERIES["server_self"]))
            standbys = [Standby(*r) for r in conn.execute(QUERIES["server_standbys"])]
            processes = [Sessions(role, node, count, list(clients), start, visible)
                         for role, node, count, clients, start, visible in conn.execute(QUERIES["chronos_sessions"])]
            address = None if host is None else f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            return ServerView(at, self.link.server, address, in_recovery, version, standbys, processes)
        return self._run(run)



def role_store(settings: Settings, node_id: uuid.UUID, role: str, *, synchronous_commit: bool = True) -> Store:
    """A process's own store: the hot path's planner settings, CHRONOS_DATABASE_TIMEOUT_MS as the deadline
    of every call, an application name that says which process it is (`pg_stat_activity`, `chronos
    status`), and CHRONOS_DATABASE_POOL_MODE (settled at the process's start: chronos.runtime.process)."""
    return Store(settings.require_database(), node_id=node_id, hot_path=True, synchronous_commit=synchronous_commit,
                 deadline_s=settings.database_timeout_ms / 1000.0, application_name=application_name(role, node_id),
                 pool_mode=settings.database_pool_mode)


def application_name(role: str, node_id: uuid.UUID) -> str:
    """`chronos <role> <node id>`: how a process's sessions show in pg_stat_activity."""
    return f"chronos {role} {node_id}"


def wait_for_database(url: str, timeout: float) -> None:
    """Block until PostgreSQL answers, or raise UnavailableError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            connect(url, connect_timeout=max(1, int(min(5, timeout)))).close()
            return
        except StoreUnavailable as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise UnavailableError(last)
        time.sleep(0.5)




# held to the port by the type checker: a method the roles call that this store lacks fails `mypy`
_PORT: type[ports.Store] = Store
