"""One connection to PostgreSQL as a store uses it: opened on first use and again after it broke, every
call under a deadline and with the driver's errors translated into the project's, and the session's
settings made once per connection, or in every transaction through a pooler in transaction mode
(`pooling`). `chronos.adapters.postgres.store.Store` runs its statements through it: one class per port
(`intake`, `claims`, `settle`, `detect`, `operators`), each over this one.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Iterator

import psycopg

from chronos import ports
from chronos.adapters.postgres import pooling
from chronos.adapters.postgres.connection import (DEADLINES, connect, connection_lost, local_address, one, server_of,
                                                  short, translate)
from chronos.adapters.postgres.migrations import check_schema_raw
from chronos.adapters.postgres.queries import LAST_SEQ_VERSION, QUERIES
from chronos.errors import StoreUnavailable

log = logging.getLogger("chronos.store")


# How long a call of an operator's or a command's store may wait for PostgreSQL; the processes pass
# CHRONOS_DATABASE_TIMEOUT_MS instead.
DEFAULT_DEADLINE_S = 60.0

# How long a firer's claim that deletes waits for a row another firer took since it chose it (a moment's race
# between two claims of one slice) before its batch rolls back: another firer's batch is held for as long as
# Kafka takes to acknowledge it.
HELD_LOCK_TIMEOUT_MS = 200

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


class Session:
    """One connection, reopened with backoff when it breaks. Not thread-safe: one per thread (only
    `cancel` may be called from another). `node_id` is the process's, whose claims a store stamps with it.

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
                 application_name: str = "chronos", pool_mode: str = pooling.SESSION,
                 held_ms: int | None = None, lock_timeout_ms: int | None = None, lock_wait_s: float = 0.0):
        """`held_ms`: a session whose transactions a firer holds open (the claim that deletes): PostgreSQL ends
        it once idle in a transaction that long (`held_session_settings`). `lock_timeout_ms`: a statement
        waiting that long for a row's lock fails (LockNotAvailable, which `_guarded` lets through, the
        connection kept), rather than wait for as long as a firer holds the row; a write that does is tried
        again for up to `lock_wait_s` (`IntakeStatements.apply`)."""
        self.url = url
        self.node_id = node_id
        self.hot_path = hot_path
        self.synchronous_commit = synchronous_commit
        self.held_ms = held_ms
        self.lock_timeout_ms = lock_timeout_ms
        self.lock_wait_s = lock_wait_s
        self.deadline_s = deadline_s
        self.application_name = application_name
        self.pool_mode = pool_mode
        # transaction_settings' parameters, for a transaction through a pooler in transaction mode; None: none to make
        self._settings: dict[str, str | None] | None = None
        if hot_path or not synchronous_commit or lock_timeout_ms is not None:
            self._settings = {"planner": "off" if hot_path else None,
                              "synchronous_commit": None if synchronous_commit else "off",
                              "lock_timeout": None if lock_timeout_ms is None else str(lock_timeout_ms)}
        self.conn: psycopg.Connection | None = None
        self.link = ports.Link()
        self._avoid: str | None = None  # the server the last connection failed on: tried last next time
        self._staging_ready = False  # the consumer's staging table is made on this connection (create_staging)
        # the schema's version as the connection found it at open (None: not checked): what it holds to write
        self.schema_version: int | None = None
        self.last_ok = 0.0  # time.monotonic() of the last statement PostgreSQL answered (for /healthz)
        self.last_unanswered = 0.0  # time.monotonic() of the last that found it out of reach (connecting, too)

    @property
    def pooled(self) -> bool:
        """Whether this store talks to PostgreSQL through a pooler in transaction mode."""
        return self.pool_mode == pooling.TRANSACTION

    def open(self, *, check: bool = True) -> None:
        self.close()
        if self.pool_mode == pooling.AUTO:
            self.pool_mode = pooling.resolve_pool_mode(self.url, self.pool_mode)
        conn = connect(self.url, application_name=self.application_name, avoid=self._avoid, prepared=not self.pooled)
        self.conn, self._staging_ready = conn, False
        replaced = self.link.connected(server_of(conn))
        if replaced is not None:
            log.warning("connected to PostgreSQL at %s, another server than before (%s): a failover or a "
                        "switchover", self.link.server, replaced)

        def settle(conn: psycopg.Connection) -> None:
            if check:
                self.schema_version = check_schema_raw(conn)
            if self.pooled:  # made in each transaction instead: see _execute and _transaction
                return
            if self.hot_path:
                conn.execute(QUERIES["hot_path_settings"])
            if not self.synchronous_commit:
                conn.execute(QUERIES["async_commit"])
            if self.lock_timeout_ms is not None:
                conn.execute(QUERIES["lock_timeout"], {"ms": str(self.lock_timeout_ms)})
            if self.held_ms is not None:
                conn.execute(QUERIES["held_session_settings"], self.held_params(local=False))
        self._guarded(conn, settle)

    def held_params(self, *, local: bool) -> dict[str, Any]:
        """The parameters of held_session_settings: the hold time, the server's TCP keepalives after a quarter
        of it (a whole second at least), two probes, the wait for a row's lock (HELD_LOCK_TIMEOUT_MS, a tenth
        of the hold time at most) and the session's own application name."""
        assert self.held_ms is not None
        return {"hold_ms": str(self.held_ms), "keepalive_s": str(max(1, self.held_ms // 4000)),
                "lock_ms": str(max(1, min(HELD_LOCK_TIMEOUT_MS, self.held_ms // 10))),
                "application_name": self.application_name, "local": local}

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

    def db_clock_us(self) -> int:
        """The database's clock, in epoch microseconds: a statement of every port's (the consumer's, the
        settling thread's, the operators')."""
        return self._run(lambda c: one(self._execute(c, QUERIES["db_clock"]))[0])

    def announce(self, role: str, scheme: str, port: int, address: str | None) -> str:
        """`ports.Presence.announce`: with no address, the local address of this store's connection (the
        host's on its way to PostgreSQL), 127.0.0.1 over a Unix socket."""
        def run(conn: psycopg.Connection) -> str:
            host = address or local_address(conn)
            url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/metrics"
            self._execute(conn, QUERIES["announce_process"], {"node": self.node_id, "role": role, "url": url})
            return url
        return self._run(run)

    def withdraw(self) -> None:
        """`ports.Presence.withdraw`."""
        self._run(lambda c: self._execute(c, QUERIES["withdraw_process"], {"node": self.node_id}))

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
        except (psycopg.errors.TransactionRollback, psycopg.errors.LockNotAvailable):
            raise  # the caller runs it again (the transaction rolled back, the connection is fine)
        except psycopg.Error as exc:
            server = self.link.server
            if watch.fired:
                self.link.unanswered += 1
                self.link.unanswered_at = time.monotonic()
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
                    self.last_unanswered = time.monotonic()
                    raise StoreUnavailable(short(exc, self.url)) from None
                log.info("transaction rolled back (%s); running it again", short(exc, self.url))
                time.sleep(0.01 * (attempt + 1))
            except StoreUnavailable:
                self.last_unanswered = time.monotonic()
                raise
        self.last_ok = time.monotonic()
        return result

    def _execute(self, conn: psycopg.Connection, query: str, params: Any = None, *,
                 prepare: bool | None = None, binary: bool = False) -> psycopg.Cursor:
        """conn.execute(query, params, prepare=prepare, binary=binary); through a pooler in transaction mode
        never prepared, and, outside a transaction, sent in one pipeline after the store's
        transaction_settings: one implicit transaction (the pipeline's one sync ends it) and one round trip
        (three, in an explicit transaction, where libpq has no pipeline mode: before 14). Its results are there
        when this returns."""
        if not self.pooled:
            return conn.execute(query, params, prepare=prepare, binary=binary)
        if self._settings is None or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return conn.execute(query, params, binary=binary)
        with conn.pipeline() if PIPELINE else conn.transaction():
            conn.execute(QUERIES["transaction_settings"], self._settings)
            cur = conn.execute(query, params, binary=binary)
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


class LastSeq(Session):
    """The messages' last seq, for a firer's claims (`ports.DueClaims.last_seq`)."""

    last_seq_allowed: bool | None = None  # whether this role may run chronos_last_seq() (None: not asked yet)
    last_seq_told = False  # whether a session of this process said it may not (the class's: said once a process)

    def _last_seq(self, conn: psycopg.Connection) -> int | None:
        """None before schema version 18, or where the role may not run the function (EXECUTE revoked from
        PUBLIC): said once a process, and the firer's claims then start past their last row only after one that
        came back full."""
        if (self.schema_version or 0) < LAST_SEQ_VERSION:  # known once connected
            return None
        if self.last_seq_allowed is None:
            self.last_seq_allowed = bool(one(self._execute(conn, QUERIES["last_seq_allowed"]))[0])
            if not self.last_seq_allowed and not LastSeq.last_seq_told:
                LastSeq.last_seq_told = True
                log.warning("this role may not run chronos_last_seq() (GRANT EXECUTE ON FUNCTION chronos_last_seq() "
                            "to it): the firer's claims walk the rows it took lately, more work for PostgreSQL")
        if not self.last_seq_allowed:
            return None
        return one(self._execute(conn, QUERIES["last_seq"], prepare=True))[0]
