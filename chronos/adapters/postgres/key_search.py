"""`chronos key-search`: the index that serves an operator's search by message key (`chronos list --key`, the
actions' `--filter --key`, the console's search by key), built or dropped at an operator's word.

Every message with a key writes an entry in it when it is stored, and leaves one for vacuum when it fires:
PostgreSQL's CPU and WAL on every write (docs/benchmarks/latest.md has the figures). So since migration 19 a
database has it only where an operator asks. Without it a search by key still answers, reading the rows in
deadline order until its page is full (every waiting row of the range it covers, at worst).

The build and the drop run CONCURRENTLY (no write waits for them), one at a time with `chronos migrate`'s own
migrations outside a transaction (its session lock). A build cut off (Ctrl-C, a lost connection) leaves the
index invalid: written to, never read. `state` says so, `turn_on` builds it again and `turn_off` drops it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NamedTuple

import psycopg

from chronos.adapters.postgres.connection import connect, short
from chronos.adapters.postgres.migrations import check_schema_raw, session_lock
from chronos.adapters.postgres.queries import QUERIES
from chronos.config import redact_url
from chronos.errors import StoreRejected, StoreUnavailable

INDEX = "chronos_messages_key_hash"
ON, OFF, INVALID = "on", "off", "invalid"


class KeySearch(NamedTuple):
    """The key-search index of one database: on, off or invalid (a build that did not finish), and its size."""

    state: str
    size_bytes: int = 0


def state(url: str) -> KeySearch:
    """Whether the database at `url` has the key-search index."""
    with _session(url) as conn:
        return _state(conn)


def turn_on(url: str) -> tuple[KeySearch, bool]:
    """Build the key-search index unless it is there (an invalid one is dropped and built again): its state
    after, and whether this call built it."""
    with _session(url) as conn, session_lock(conn):
        before = _state(conn)
        if before.state == ON:
            return before, False
        if before.state == INVALID:
            conn.execute(QUERIES["drop_key_search_index"])
        conn.execute("SET statement_timeout = 0")  # a build cut off by a timeout would leave it invalid
        conn.execute(QUERIES["create_key_search_index"])
        return _state(conn), True


def turn_off(url: str) -> tuple[KeySearch, bool]:
    """Drop the key-search index, valid or not: its state after (off), and whether this call dropped it."""
    with _session(url) as conn, session_lock(conn):
        before = _state(conn)
        if before.state != OFF:
            conn.execute(QUERIES["drop_key_search_index"])
        return _state(conn), before.state != OFF


def _state(conn: psycopg.Connection) -> KeySearch:
    row = conn.execute(QUERIES["key_search_index"]).fetchone()
    if row is None:
        return KeySearch(OFF)
    valid, size = row
    return KeySearch(ON if valid else INVALID, int(size))


@contextmanager
def _session(url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to a migrated database, closed however the block ends, the driver's errors said
    in one line."""
    try:
        with connect(url, autocommit=True, prepared=False) as conn:
            check_schema_raw(conn)
            yield conn
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise StoreUnavailable(f"PostgreSQL at {redact_url(url)}: {short(exc, url)}") from None
    except psycopg.Error as exc:  # e.g. a role that does not own the table: one line, not a traceback
        raise StoreRejected(f"key search: {short(exc, url)}") from None
