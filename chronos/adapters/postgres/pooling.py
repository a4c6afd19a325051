"""Connection poolers between Chronos and PostgreSQL (PgBouncer, or any pooler that works the same way), and
the two ways a store talks through them: CHRONOS_DATABASE_POOL_MODE.

A pooler in session mode (PgBouncer's `pool_mode = session`) gives each client connection a server
connection of its own until the client disconnects: everything holds as on a direct connection, and a store
works as it does there (`session`): prepared statements, and the planner and commit settings set once per
connection.

A pooler in transaction mode (`pool_mode = transaction`) lends a client a server connection for one
transaction, then to whichever client asks next: nothing may outlive a transaction. A store in
`transaction` mode therefore
- prepares no statement (psycopg prepares one on request, and any statement run `prepare_threshold` times:
  the next transaction may run on a server connection that never saw it);
- sets its planner and commit settings in every transaction that needs them, with `set_config(..., true)`,
  which end with the transaction: a session setting would stay on the server connection and change the
  statements of every client it is lent to next. A statement on its own is sent in one pipeline with them,
  one implicit transaction and one round trip;
- makes the consumer's staging table in the transaction that uses it, dropped at its commit.

`auto` (the default) asks the pooler, when a process starts, which of the two it is (`probe`, on two
connections of `detect_pool_mode`'s own). A pooler in statement mode allows no transaction of more than one
statement: Chronos refuses it.
"""

from __future__ import annotations

from typing import Callable

import psycopg

from chronos.adapters.postgres.connection import DEADLINES, connect, one, short
from chronos.adapters.postgres.queries import QUERIES
from chronos.config import redact_url
from chronos.errors import ConfigError, PoolModeMismatch, StoreUnavailable

AUTO, SESSION, TRANSACTION = "auto", "session", "transaction"
MODES = (AUTO, SESSION, TRANSACTION)
SETTING = "CHRONOS_DATABASE_POOL_MODE"

# How many more times the probe asks connection A for its backend, while B holds a transaction and after.
PROBE_ROUNDS = 3

# SQLSTATEs of what only a pooler that moves a client between server connections causes, to a store that
# does not expect it: a statement it prepared is not there (invalid_sql_statement_name), another client's
# is (duplicate_prepared_statement), the session's staging table is gone (undefined_table).
_PREPARED_MISSING, _PREPARED_TAKEN, _UNDEFINED_TABLE = "26000", "42P05", "42P01"
_STAGING_TABLE = "chronos_staging"

# How long the pool mode probe may wait for PostgreSQL (through a pooler whose servers are all busy, it waits).
POOL_PROBE_DEADLINE_S = 10.0


def probe(a: psycopg.Connection, b: psycopg.Connection, backend_pid: Callable[[psycopg.Connection], int]) -> str:
    """TRANSACTION if the two connections `a` and `b` (autocommit, to the same URL) reach PostgreSQL through a
    pooler that lends server connections per transaction, else SESSION.

    A asks for its backend's pid. B opens a transaction and asks the same: a pooler in transaction mode has
    just had A's server connection back, and lends the most recently used one first (PgBouncer's default),
    so B most likely gets A's backend. If not, A asks again, a few times while B holds its transaction and a
    few times after: a pooler that hands server connections out in turn (PgBouncer's `server_round_robin`)
    lends A another one soon.

    What it can tell: two client connections on one backend, or one client connection on two backends,
    happen only behind a pooler that lends server connections per transaction (or per statement), so
    TRANSACTION is certain. What it cannot: SESSION only means that none of these few statements moved, so
    a pooler in transaction mode that happened to give A its backend back every time (other clients taking
    every other server connection just then) passes for SESSION; the store's backstop then stops the
    process at its first vanished prepared statement or staging table, naming the setting. Nor can it tell
    a pooler in session mode from a direct connection, and need not: both keep a connection's state.

    A pooler in statement mode refuses B's transaction: ConfigError."""
    first = backend_pid(a)
    try:
        with b.transaction():
            if backend_pid(b) == first:
                return TRANSACTION
            if any(backend_pid(a) != first for _ in range(PROBE_ROUNDS)):
                return TRANSACTION
    except psycopg.Error as exc:
        if "statement pool" in str(exc):  # PgBouncer: "transaction blocks not allowed in statement pooling mode"
            raise ConfigError(f"PostgreSQL is reached through a pooler in statement mode, which allows no "
                              f"transaction: put Chronos behind one in transaction or session mode ({SETTING})") from None
        raise
    return TRANSACTION if any(backend_pid(a) != first for _ in range(PROBE_ROUNDS)) else SESSION


def detect_pool_mode(url: str, *, deadline_s: float = POOL_PROBE_DEADLINE_S) -> str:
    """Whether `url` leads to PostgreSQL through a pooler in transaction mode (TRANSACTION) or not (SESSION),
    by `probe` on two connections of its own. StoreUnavailable (StoreRefused) when they cannot be had or
    PostgreSQL does not answer within `deadline_s`; ConfigError for a pooler in statement mode."""
    name = "chronos pool probe"
    with connect(url, application_name=name, prepared=False) as a, connect(url, application_name=name,
                                                                         prepared=False) as b:
        watches = [DEADLINES.arm(conn, deadline_s) for conn in (a, b)]
        try:
            return probe(a, b, lambda conn: one(conn.execute(QUERIES["backend_pid"]))[0])
        except psycopg.Error as exc:
            if any(w.fired for w in watches):
                raise StoreUnavailable(f"PostgreSQL at {redact_url(url)} did not answer the pool mode probe within "
                                       f"{deadline_s:g}s") from None
            raise StoreUnavailable(f"probing PostgreSQL at {redact_url(url)} for a pooler: {short(exc, url)}") from None
        finally:
            for w in watches:
                DEADLINES.disarm(w)


def resolve_pool_mode(url: str, mode: str, *, check: bool = False) -> str:
    """The mode to talk to `url` in: `mode` itself when it is session or transaction, what the probe finds
    for auto. With `check` (`chronos up`, `chronos migrate`: before anything starts) session is probed too,
    and refused when the probe finds a pooler in transaction mode (PoolModeMismatch)."""
    if mode == TRANSACTION or (mode == SESSION and not check):
        return mode
    found = detect_pool_mode(url)
    if mode == SESSION and found == TRANSACTION:
        raise contradicted(redact_url(url))
    return found if mode == AUTO else mode


def vanished(exc: psycopg.Error) -> str | None:
    """What `exc` shows a connection lost between two of its statements, when it is an error only a pooler in
    transaction mode causes to a store in session mode; else None."""
    state = exc.sqlstate
    if state == _PREPARED_MISSING:
        return "a statement prepared on the connection is not there"
    if state == _PREPARED_TAKEN:
        return "the connection holds another client's prepared statement"
    if state == _UNDEFINED_TABLE and _STAGING_TABLE in str(exc):
        return "the connection's staging table is gone"
    return None


def mismatch(server: str | None, what: str) -> PoolModeMismatch:
    """The one-line error of a store in session mode that found itself behind a pooler in transaction mode."""
    return PoolModeMismatch(f"PostgreSQL at {server} is reached through a pooler in transaction mode ({what}) "
                            f"while this process talks to it in session mode: set {SETTING}=transaction")


def contradicted(server: str) -> PoolModeMismatch:
    """The one-line error of `SETTING`=session when the probe finds a pooler in transaction mode."""
    return PoolModeMismatch(f"{SETTING}=session, but PostgreSQL at {server} is reached through a pooler in "
                            f"transaction mode (two connections shared one backend): set {SETTING}=transaction "
                            f"or auto")
