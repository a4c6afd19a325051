"""How long the first page of `chronos list` takes with every filter, on a store of N waiting rows.

    python -m benchmarks.list_filters [--rows 10000000] [--data-dir .bench-list] [--repeat 5]

Builds the rows once in an embedded PostgreSQL under --data-dir (kept, so a second run reuses them;
`--rebuild` starts again): deadlines spread over a year from an hour ahead, 1% sent to another topic,
keys unique, 1% with one of 100,000 ordering keys (benchmarks/harness/database.py), 1,000 recurring
schedules, 1,000 rows in flight, and the key-search index (`chronos key-search on`). Then, for
each filter, runs `chronos.ops.inspect.list_messages` (the CLI's and the console's query) --repeat
times and prints the median and the worst time of the first page of 50, and of the page after it.
Target: under 100 ms for every filter with 10 million rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from benchmarks.harness.database import DAY_S, fill_far
from chronos.ops import inspect
from chronos.ops.inspect import Filters
from chronos.adapters.postgres import key_search
from chronos.adapters.postgres.migrations import migrate
from chronos.adapters.postgres.store import Store

OUT = "chronos.output"
YEAR_MS = 365 * DAY_S * 1000


def build(url: str, rows: int) -> None:
    started = time.monotonic()
    fill_far(url, rows, prefix="order-", ahead_s=3600.0, spacing_ms=YEAR_MS / rows, payload_bytes=1, varied=True,
             vacuum=False, progress=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline, cron, key, value, headers) "
                     "SELECT 'sched-' || g, now() + g * interval '1 minute', '0 9 * * *', 'k', 'v', '' "
                     "FROM generate_series(1, 1000) g")
        conn.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = gen_random_uuid() "
                     "WHERE id IN (SELECT id FROM chronos_messages WHERE cron IS NULL ORDER BY deadline LIMIT 1000)")
        conn.execute("VACUUM ANALYZE chronos_messages")
    print(f"built {rows:,} rows in {time.monotonic() - started:.0f}s", flush=True)


def cases(now: datetime) -> list[tuple[str, Filters]]:
    return [
        ("no filter", Filters()),
        ("--state waiting", Filters(state="waiting")),
        ("--state in_flight", Filters(state="in_flight")),
        ("--state recurring", Filters(state="recurring")),
        ("--due-after +30d", Filters(due_after=now + timedelta(days=30))),
        ("--due-before +2h", Filters(due_before=now + timedelta(hours=2))),
        ("--topic billing.reminders", Filters(topic="billing.reminders")),
        ("--topic <output topic>", Filters(output_topic=True)),
        ("--key customer-4242", Filters(key=b"customer-4242")),
        ("--ordering-key invoice-4203", Filters(ordering_key="invoice-4203")),
        ("--id-prefix order-0042", Filters(id_prefix="order-0042")),
        ("--key + --state waiting", Filters(key=b"customer-777", state="waiting")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--data-dir", default=".bench-list")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()

    from chronos.embedded.postgres import EmbeddedPostgres
    base = Path(args.data_dir)
    server = EmbeddedPostgres(base / "data", fast=True, log_path=base / "postgres.log")
    server.start()
    try:
        url = server.url
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            have = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'chronos_messages'"
                                ).fetchone()[0]
            if args.rebuild or have < args.rows * 0.9:
                conn.execute("TRUNCATE chronos_messages")
                build(url, args.rows)
        key_search.turn_on(url)  # as an operator who searches by key builds it (chronos key-search on)
        store = Store(url)
        now = datetime.now(timezone.utc)
        print(f"{'filter':<32} {'first page':>12} {'worst':>9} {'next page':>10} {'rows':>5}")
        for name, f in cases(now):
            firsts, nexts, n = [], [], 0
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                page = inspect.list_messages(store, f, output_topic=OUT, limit=50)
                firsts.append(time.perf_counter() - t0)
                n = len(page.items)
                if page.cursor:
                    t0 = time.perf_counter()
                    inspect.list_messages(store, f, output_topic=OUT, limit=50, after=page.cursor)
                    nexts.append(time.perf_counter() - t0)
            print(f"{name:<32} {statistics.median(firsts) * 1000:9.1f} ms {max(firsts) * 1000:6.1f} ms "
                  + (f"{statistics.median(nexts) * 1000:7.1f} ms" if nexts else f"{'-':>10}") + f" {n:>5}",
                  flush=True)
        store.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
