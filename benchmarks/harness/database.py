"""The stack's PostgreSQL seen directly, beside the programs: a database next to the store, far-future
rows written in bulk, the queue table's size, waiting until it is empty."""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psycopg

from chronos.domain.model import Row

TABLE = "chronos_messages"
FAR_CHUNK = 50_000  # far-future rows a transaction
DAY_S = 86_400.0


@contextlib.contextmanager
def migrated_postgres(prefix: str) -> Iterator:
    """A PostgreSQL of its own for a benchmark that needs no stack: the embedded server `chronos up` runs,
    with its durable settings, in a temporary directory, migrated to the schema of the checkout; stopped
    and removed at the end. Yields the server (its `url`, its `pid`)."""
    from chronos.adapters.postgres.migrations import migrate
    from chronos.embedded.postgres import EmbeddedPostgres
    from chronos.embedded.procs import free_port
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", port=free_port(), log_path=Path(tmp) / "pg.log")
        pg.start()
        try:
            migrate(pg.url)
            yield pg
        finally:
            pg.stop()


def database_url_for(url: str, name: str) -> str:
    """The URL of database `name` on the same server as `url`."""
    base, _, rest = url.rpartition("/")
    query = rest.partition("?")[2]
    return f"{base}/{name}" + (f"?{query}" if query else "")


def ensure_database(url: str, name: str) -> None:
    """Database `name` on the server of `url`, created unless it is there; `name` is the caller's constant."""
    with psycopg.connect(url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def far_row(g: int, *, prefix: str, start_us: int, spacing_us: float, value: bytes, varied: bool,
            partition: int | None = None) -> Row:
    """Far-future row number `g` (from 1): see fill_far."""
    return Row(id=f"{prefix}{g:09d}", deadline_us=start_us + int((g - 1) * spacing_us),
               topic="billing.reminders" if varied and g % 100 == 7 else None, key=b"customer-%d" % g, value=value,
               headers=b"", ordering_key=f"invoice-{g % 100_000}" if varied and g % 100 == 3 else None,
               input_partition=partition)


def fill_far(url: str, rows: int, *, prefix: str = "far-", ahead_s: float = 365 * DAY_S, spacing_ms: float = 1.0,
             payload_bytes: int = 100, varied: bool = False, vacuum: bool = True, progress: bool = False,
             partition: int | None = None, first: int = 1) -> float:
    """Write `rows` waiting messages into the store, due from `ahead_s` seconds on and `spacing_ms` apart,
    through the consumer's own COPY path (`Store.insert`, FAR_CHUNK rows a transaction); then, if `vacuum`,
    VACUUM ANALYZE the table, as autovacuum would within a minute on a store in its steady state. The
    seconds it took.

    Ids are `prefix` and a 9-digit number from 1, keys `customer-N`, values `payload_bytes` bytes; with
    `varied`, one row in a hundred goes to the topic `billing.reminders` and another has one of 100,000
    ordering keys (`invoice-N`), as operators' filters find them. `progress` prints a line at every
    million rows. `partition`: the input partition the rows say they were read from (none by default). `first`:
    the number of the first row (its id and its place in the deadlines' order)."""
    from chronos.adapters.postgres.store import Store
    started = time.monotonic()
    shape = {"prefix": prefix, "start_us": time.time_ns() // 1000 + int(ahead_s * 1e6),
             "spacing_us": spacing_ms * 1000.0, "value": b"\xab" * payload_bytes, "varied": varied,
             "partition": partition}
    store = Store(url)
    try:
        for low in range(first, first + rows, FAR_CHUNK):
            last = min(first + rows - 1, low + FAR_CHUNK - 1)
            store.insert([far_row(g, **shape) for g in range(low, last + 1)])
            if progress and (last % 1_000_000 < FAR_CHUNK or last == first + rows - 1):
                print(f"  far rows: {last:,}/{rows:,} ({time.monotonic() - started:.0f}s)", flush=True)
    finally:
        store.close()
    if vacuum:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {TABLE}")
    return time.monotonic() - started


def age_table(url: str, rows: int, *, partition: int, backlog: int = 100_000, progress: bool = False) -> float:
    """Put `rows` messages through the store's table as a queue `backlog` rows deep would: written through the
    consumer's own COPY path (fill_far's rows, ids `aged-N`, due in a month, of input partition `partition`)
    FAR_CHUNK at a time, and each chunk deleted once `backlog` rows came after it, as the firers' claims delete
    what they fired; autovacuum meanwhile as it runs, then VACUUM ANALYZE. The table keeps what such a history
    leaves: its size, its indexes' bloat, its free space scattered. The seconds it took."""
    started = time.monotonic()
    written = 0
    with psycopg.connect(url, autocommit=True) as conn:
        def delete_through(last: int) -> None:
            conn.execute(f"DELETE FROM {TABLE} WHERE id >= 'aged-' AND id <= %s", (f"aged-{last:09d}",))
        while written < rows:
            chunk = min(FAR_CHUNK, rows - written)
            fill_far(url, chunk, prefix="aged-", ahead_s=30 * DAY_S, partition=partition, vacuum=False,
                     first=written + 1)
            written += chunk
            if written > backlog:
                delete_through(written - backlog)
            if progress and (written % 1_000_000 < FAR_CHUNK or written == rows):
                print(f"  aged rows: {written:,}/{rows:,} ({time.monotonic() - started:.0f}s)", flush=True)
        delete_through(written)
        conn.execute(f"VACUUM ANALYZE {TABLE}")
    return time.monotonic() - started


def table_mb(url: str) -> float | None:
    """The queue table with its indexes and TOAST, MB (bloat included), or None when it cannot be read."""
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            size = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (TABLE,)).fetchone()
    except psycopg.Error:
        return None
    return round(size[0] / 2**20, 1) if size else None


def wait_drained(url: str, table: str, timeout: float = 180.0) -> bool:
    """Wait until the queue table `table` (a constant of the caller: the target's) is empty on two reads a
    second apart; False, and a line, when it still holds rows after `timeout`."""
    end = time.monotonic() + timeout
    empty_reads = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < end:
            n = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            empty_reads = empty_reads + 1 if n == 0 else 0
            if empty_reads >= 2:
                return True
            time.sleep(1.0)
    print(f"the {table} table still holds rows after {timeout:.0f}s; going on", flush=True)
    return False
