"""The schema: versioned migrations (`sql/NNNN_*.sql`), `chronos migrate`, and the check every process
makes at start that the database is at a version this chronos runs on, on a server it supports.

Rolling upgrades run two releases side by side: the new release migrates, then its processes replace
the old ones host by host. So each migration says, in a directive among its first comment lines, which
processes still run on the schema it makes:

    -- chronos: compatible from 8     processes of schema version 8 and newer run on it (it only adds:
                                      a column with a default, a table, an index); without the directive,
                                      only processes of its own version or newer
    -- chronos: outside a transaction its statements run one at a time, outside any transaction, as
                                      CREATE INDEX CONCURRENTLY must (no write waits for the build)

`chronos migrate` records each migration's window in `chronos_schema_version.compatible_from`, where
the processes of an older release read it: they run on a newer schema whose every newer migration is
compatible with their version, and stop with exit 4, naming the window, on one that is not.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import psycopg

from chronos.adapters.postgres.connection import connect, one, short
from chronos.adapters.postgres.queries import QUERIES, SQL_DIR
from chronos.config import redact_url
from chronos.errors import SchemaError, StoreRejected, StoreUnavailable, UnsupportedServer

if TYPE_CHECKING:  # the folder is only named in an annotation
    from importlib.abc import Traversable

# Postgres advisory lock key that serialises concurrent `chronos migrate` runs.
_MIGRATE_LOCK = 0x6368726F6E6F73
# How often a migrator asks again for the lock of a migration outside a transaction that another one runs.
_LOCK_RETRY_S = 0.1

# The oldest PostgreSQL Chronos supports: the oldest its tests run against (Debian's PostgreSQL 15, beside
# the embedded 18). Older servers are refused by `chronos migrate` and by the processes at start.
MIN_SERVER_VERSION = 150000  # server_version_num

_DIRECTIVE = re.compile(r"^--\s*chronos:\s*(.*?)\s*$", re.M)
_CONCURRENT_INDEX = re.compile(r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)


@dataclass(frozen=True)
class Migration:
    """One migration file: its version, name and SQL, the oldest schema version whose processes run on
    the schema it makes, and whether it runs outside a transaction."""

    version: int
    name: str
    sql: str
    compatible_from: int
    outside_transaction: bool = False

    @classmethod
    def parse(cls, version: int, name: str, sql: str) -> "Migration":
        compatible, outside = version, False
        for directive in _DIRECTIVE.findall(sql):
            if match := re.fullmatch(r"compatible from (\d+)", directive):
                compatible = int(match.group(1))
            elif directive == "outside a transaction":
                outside = True
            else:
                raise ValueError(f"migration {version:04d}_{name}: unknown directive {directive!r}")
        if compatible > version:
            raise ValueError(f"migration {version:04d}_{name}: compatible from {compatible}, a version after its own")
        return cls(version, name, sql, compatible, outside)

    def statements(self) -> list[str]:
        """Its statements one by one (for a migration outside a transaction: one statement a line ends with
        `;`, comments apart)."""
        body = "\n".join(line for line in self.sql.splitlines() if not line.lstrip().startswith("--"))
        return [s.strip() for s in re.split(r";\s*$", body, flags=re.M) if s.strip()]


def migrations(folder: Traversable = SQL_DIR) -> list[Migration]:
    """Every migration file of `folder`, in order. Two files of one version are refused with both names:
    two schema changes made side by side must not ship as one version, whichever the loader met first."""
    found: dict[int, tuple[str, Migration]] = {}
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            version = int(match.group(1))
            if version in found:
                first, second = sorted((found[version][0], entry.name))
                raise ValueError(f"two migrations of version {version}: {first} and {second}; "
                                 "give one of them the next free number")
            found[version] = entry.name, Migration.parse(version, match.group(2), entry.read_text())
    return [migration for _, (_, migration) in sorted(found.items())]


LATEST_VERSION = migrations()[-1].version
# The oldest schema this chronos runs on. Version 9 only adds the firers' leases and their share index;
# on 8 the firers claim from every slice, as 0.1.0's do, so a store at 0.1.0's schema (which knows no
# compatibility window, and stops on any newer schema) runs this release's processes host by host before
# `chronos migrate` brings it to 9 (docs/operations/upgrading.md).
OLDEST_VERSION = 8


def check_server_version(conn: psycopg.Connection) -> None:
    """UnsupportedServer if the server is older than MIN_SERVER_VERSION."""
    version = conn.info.server_version
    if version < MIN_SERVER_VERSION:
        raise UnsupportedServer(f"PostgreSQL {version // 10000}.{version % 10000} is older than the oldest this "
                                f"chronos supports ({MIN_SERVER_VERSION // 10000}): upgrade the server")


def migrate(url: str, available: list[Migration] | None = None) -> list[int]:
    """Apply every migration not yet applied (`available`: the package's); safe to run concurrently and
    repeatedly. A database already at the latest version is left untouched, so a role without the right
    to create tables (the one the processes run as) may run it too.

    Migrations run in transactions, several in one while they follow each other, under an advisory lock
    held to the end of it (which works through a pooler in transaction mode too). One that runs outside a
    transaction runs under a session lock instead, and is resumable: an index that an interrupted
    CREATE INDEX CONCURRENTLY left invalid is dropped and built again."""
    available = migrations() if available is None else available
    latest = available[-1].version
    applied: list[int] = []
    try:
        with connect(url, autocommit=True, prepared=False) as conn:
            check_server_version(conn)
            while True:
                with conn.transaction():
                    conn.execute(QUERIES["migrate_lock"], {"lock": _MIGRATE_LOCK})
                    current = _current(conn)
                    if current > latest:
                        raise SchemaError(f"database schema is at version {current}, newer than this chronos "
                                          f"({latest}): upgrade chronos")
                    pending = [m for m in available if m.version > current]
                    if not pending:
                        return applied
                    conn.execute(QUERIES["create_schema_version"])
                    conn.execute(QUERIES["add_compatible_from"])
                    for m in pending:
                        if m.outside_transaction:
                            break
                        conn.execute(m.sql)
                        _record(conn, m)
                        applied.append(m.version)
                pending = [m for m in pending if m.version not in applied]
                if pending and pending[0].outside_transaction:
                    if _apply_outside(conn, pending[0]):
                        applied.append(pending[0].version)
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise StoreUnavailable(f"PostgreSQL at {redact_url(url)}: {short(exc, url)}") from None
    except psycopg.Error as exc:  # e.g. no right to create the table: a one-line error, not a traceback
        raise StoreRejected(f"migration failed: {short(exc, url)}") from None


def _current(conn: psycopg.Connection) -> int:
    exists = one(conn.execute(QUERIES["has_schema_version"]))[0]
    return one(conn.execute(QUERIES["schema_version"]))[0] if exists else 0


def _record(conn: psycopg.Connection, m: Migration) -> None:
    conn.execute(QUERIES["record_migration"], {"version": m.version, "name": m.name,
                                               "compatible_from": m.compatible_from})


def _apply_outside(conn: psycopg.Connection, m: Migration) -> bool:
    """Run a migration outside a transaction under the session lock, unless another `chronos migrate`
    applied it meanwhile; whether this one did. An index of it left invalid by an interrupted build
    (a migrate killed, a connection lost) is dropped first, so the build runs again."""
    with session_lock(conn):
        if _current(conn) >= m.version:
            return False
        for index in _CONCURRENT_INDEX.findall(m.sql):
            if one(conn.execute(QUERIES["index_invalid"], {"index": index}))[0]:
                conn.execute(QUERIES["drop_index_concurrently"].format(index=_identifier(index)))
        for statement in m.statements():
            conn.execute(statement)
        with conn.transaction():
            _record(conn, m)
        return True


@contextmanager
def session_lock(conn: psycopg.Connection) -> Iterator[None]:
    """The migrators' session lock, held by whoever builds or drops an index concurrently (a migration outside a
    transaction, `chronos key-search`) so that one runs at a time. Asked for again until it is free: between tries
    the asker holds no snapshot, which another's concurrent build would wait for."""
    while not one(conn.execute(QUERIES["migrate_session_lock"], {"lock": _MIGRATE_LOCK}))[0]:
        time.sleep(_LOCK_RETRY_S)
    try:
        yield
    finally:
        conn.execute(QUERIES["migrate_session_unlock"], {"lock": _MIGRATE_LOCK})


def _identifier(name: str) -> str:
    """An index name from a migration file, checked (it is put in a DROP INDEX, not bound)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"index name {name!r} is not a plain identifier")
    return name


def check_schema(conn: psycopg.Connection) -> None:
    """SchemaError unless the database is migrated to a version this chronos runs on, on a supported server."""
    try:
        check_schema_raw(conn)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(short(exc)) from None


def check_schema_raw(conn: psycopg.Connection) -> int:
    """check_schema, with the driver's errors left to the caller (a store's, which translates them); the
    schema's version."""
    check_server_version(conn)
    current = _current(conn)
    if current < OLDEST_VERSION:
        raise SchemaError(f"database schema is at version {current}, this chronos needs {LATEST_VERSION}: "
                          f"run `chronos migrate` first")
    if current > LATEST_VERSION:
        outside = conn.execute(QUERIES["compatible_from"], {"mine": LATEST_VERSION}).fetchone()
        if outside is not None:
            raise SchemaError(f"database schema is at version {current}, newer than this chronos ({LATEST_VERSION}) "
                              f"and outside its compatibility window: migration {outside[0]} runs only with "
                              f"processes of version {outside[1]} or newer; upgrade chronos")
    return current
