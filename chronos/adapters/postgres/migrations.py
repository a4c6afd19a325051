"""The schema: versioned migrations (`sql/NNNN_*.sql`), `chronos migrate`, and the check every process
makes at start that the database is at this chronos's version on a server it supports."""

from __future__ import annotations

import re

import psycopg

from chronos.adapters.postgres.connection import connect, one, short
from chronos.adapters.postgres.queries import QUERIES, SQL_DIR
from chronos.config import redact_url
from chronos.errors import SchemaError, StoreRejected, StoreUnavailable, UnsupportedServer

# Postgres advisory lock key that serialises concurrent `chronos migrate` runs.
_MIGRATE_LOCK = 0x6368726F6E6F73

# The oldest PostgreSQL Chronos supports: the oldest its tests run against (Debian's PostgreSQL 15, beside
# the embedded 18). Older servers are refused by `chronos migrate` and by the processes at start.
MIN_SERVER_VERSION = 150000  # server_version_num


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration file, in order."""
    found = []
    for entry in SQL_DIR.iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found)


LATEST_VERSION = migrations()[-1][0]


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
                exists = one(conn.execute(QUERIES["has_schema_version"]))[0]
                current = one(conn.execute(QUERIES["schema_version"]))[0] if exists else 0
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


def check_schema(conn: psycopg.Connection) -> None:
    """SchemaError unless the database is migrated to this chronos's version on a supported server."""
    try:
        check_schema_raw(conn)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(short(exc)) from None


def check_schema_raw(conn: psycopg.Connection) -> None:
    """check_schema, with the driver's errors left to the caller (a store's, which translates them)."""
    check_server_version(conn)
    exists = one(conn.execute(QUERIES["has_schema_version"]))[0]
    current = one(conn.execute(QUERIES["schema_version"]))[0] if exists else 0
    if current < LATEST_VERSION:
        raise SchemaError(f"database schema is at version {current}, this chronos needs {LATEST_VERSION}: "
                          f"run `chronos migrate` first")
    if current > LATEST_VERSION:
        raise SchemaError(f"database schema is at version {current}, newer than this chronos "
                          f"({LATEST_VERSION}): upgrade chronos")
