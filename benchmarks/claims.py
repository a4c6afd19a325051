"""Do several firers' claims collide? Live rows fetched per claimed row, with one, two and four firers.

    python -m benchmarks.claims                                  # 1, 2 and 4 firers, 20 s each, 5,000 msg/s
    python -m benchmarks.claims --firers 2 --firers 4 --duration 30 --rate 10000 --out claims.json
    python -m benchmarks.claims --drain 100000 --claimers 1 --claimers 2    # one firer drains a backlog

Each firer is the firer's own claimer (`chronos.roles.firer.claimer.Claimer`, on a store of its own with the
firer's connection settings), claiming in a loop as the firer does; what it claims is deleted at once on a
second connection, as the settler would once Kafka acknowledged it. A writer inserts `--rate` rows a second,
due one second after they are written, in batches every 100 ms. The due indexes' `idx_tup_fetch`
(pg_stat_user_indexes: live rows an index scan fetched from the table) over the rows claimed is the figure:
1.000 means no claim fetched a row another claim took; 1.26-1.80 is what two firers racing for the same
rows measured (docs/benchmarks/history.md). Writes one JSON row per firer count (`--out`).

With `--drain N`, one firer drains N rows already due instead: its claimers (`--claimers`, each
CHRONOS_FIRER_CLAIMERS; code without the setting runs one) on their own threads as the firer runs them,
the rows deleted on one more connection as the settler would, and the figure is the rows claimed a
second until none is left.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import psycopg

from benchmarks.harness.database import migrated_postgres
from chronos.adapters.postgres.store import Store
from chronos.config import Settings
from chronos.telemetry.metrics import FirerTelemetry
from chronos.roles.firer.claimer import Claimer
from chronos.roles.firer.decisions import PublishTiming
from chronos.roles.firer.handoff import Shared
from chronos.runtime.process import Lifecycle

# the due index, and before schema version 20 the two it replaced: whichever the schema has
DUE_INDEXES = ("chronos_messages_due_sliced", "chronos_messages_due", "chronos_messages_due_share")


def index_fetches(url: str) -> int:
    """Live rows fetched from the table through the due indexes so far."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute("SELECT coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_user_indexes "
                           "WHERE indexrelname = ANY(%s)", (list(DUE_INDEXES),)).fetchone()
    return int(row[0]) if row else 0


def writer(url: str, rate: float, stop: threading.Event) -> None:
    """`rate` rows a second, due a second after they are written, in one INSERT every 100 ms."""
    with psycopg.connect(url, autocommit=True) as conn:
        written, started = 0, time.monotonic()
        while not stop.wait(0.1):
            due = int((time.monotonic() - started) * rate) - written
            conn.execute("INSERT INTO chronos_messages (id, deadline, key, value, headers) "
                         "SELECT %s || g, now() + interval '1 second', 'k', repeat('v', 100)::bytea, ''::bytea "
                         "FROM generate_series(1, %s) g", (uuid.uuid4().hex + "-", due))
            written += due


def firer(url: str, settings: Settings, stop: threading.Event, claimed: list[int]) -> None:
    """One firer's claimer, claiming as the firer does; its rows deleted at once."""
    node = uuid.uuid4()
    claims = Store(url, node_id=node, hot_path=True, synchronous_commit=False)
    deletes = Store(url, node_id=node, hot_path=True, synchronous_commit=False)
    shared = Shared(PublishTiming(settings.timing_advance_ms))
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    claimer = Claimer(claims, settings, shared, FirerTelemetry(node, settings), Lifecycle(), outbox=outbox)  # type: ignore[arg-type]
    try:
        while not stop.is_set():
            claimer.claim(time.time())
            while not outbox.empty():
                _, rows = outbox.get()
                deletes.delete_fired(rows)
                claimed[0] += len(rows)
                shared.settled += len(rows)
                # the rows' size, where the claimer caps it (this benchmark also runs against older code)
                if hasattr(shared, "settled_bytes"):
                    shared.settled_bytes = shared.claimed_bytes
            stop.wait(max(0.0, claimer.next_claim - time.time()))
    finally:
        if hasattr(claimer, "leave"):  # gives its share up (older code has none)
            claimer.leave()
        claims.close()
        deletes.close()


def drain(url: str, rows: int, claimers: int) -> dict:
    """One firer's claimers, on their own threads, claim `rows` rows due a second ago; what they claim
    is deleted at once on one more connection. The rows claimed a second."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM chronos_messages")
        conn.execute("INSERT INTO chronos_messages (id, deadline, key, value, headers) "
                     "SELECT 'd' || g, now() - interval '1 second', 'k', repeat('v', 100)::bytea, ''::bytea "
                     "FROM generate_series(1, %s) g", (rows,))
        conn.execute("VACUUM ANALYZE chronos_messages")
    node = uuid.uuid4()
    fields = Settings.__dataclass_fields__
    settings = Settings(database_url=url, **({"firer_claimers": claimers} if "firer_claimers" in fields else {}))
    shared = Shared(PublishTiming(settings.timing_advance_ms))
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    telemetry = FirerTelemetry(node, settings)

    def store() -> Store:
        return Store(url, node_id=node, hot_path=True, synchronous_commit=False)
    if "firer_claimers" in fields:
        lead = Claimer(store(), settings, shared, telemetry, Lifecycle(), outbox=outbox, parts=claimers)  # type: ignore[arg-type]
        team = [lead] + [Claimer(store(), settings, shared, telemetry, Lifecycle(), outbox=outbox,  # type: ignore[arg-type]
                                 part=k, parts=claimers, lead=lead) for k in range(1, claimers)]
    else:  # code older than the setting: one claimer
        team = [Claimer(store(), settings, shared, telemetry, Lifecycle(), outbox=outbox)]  # type: ignore[arg-type]
    deletes = store()
    claimed, started = 0, time.monotonic()
    for claimer in team:
        claimer.start()
    try:
        while claimed < rows:
            _, batch = outbox.get(timeout=60.0)
            deletes.delete_fired(batch)
            claimed += len(batch)
            shared.settled += len(batch)
            shared.settled_bytes = shared.claimed_bytes
        elapsed = time.monotonic() - started
    finally:
        for claimer in team:
            claimer.stop()
        for claimer in team:
            claimer.join(10.0)
        deletes.close()
    return {"drain": rows, "claimers": len(team), "seconds": round(elapsed, 2), "rate": round(rows / elapsed)}


def run(url: str, firers: int, rate: float, duration: float, warmup: float) -> dict:
    settings = Settings(database_url=url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM chronos_messages")
    stop = threading.Event()
    counts = [[0] for _ in range(firers)]
    threads = [threading.Thread(target=writer, args=(url, rate, stop), daemon=True)]
    threads += [threading.Thread(target=firer, args=(url, settings, stop, c), daemon=True) for c in counts]
    for t in threads:
        t.start()
    time.sleep(warmup)
    fetched, claimed = index_fetches(url), sum(c[0] for c in counts)
    time.sleep(duration)
    fetched, claimed = index_fetches(url) - fetched, sum(c[0] for c in counts) - claimed
    stop.set()
    for t in threads:
        t.join(30.0)
    return {"firers": firers, "rate": rate, "duration_s": duration, "claimed": claimed, "fetched": fetched,
            "fetched_per_claimed": round(fetched / claimed, 3) if claimed else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--firers", type=int, action="append", help="firer count; repeat it (default: 1, 2 and 4)")
    parser.add_argument("--rate", type=float, default=5000.0, help="rows written a second (default 5,000)")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per firer count")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--drain", type=int, default=None, help="one firer drains this many due rows instead")
    parser.add_argument("--claimers", type=int, action="append", help="with --drain: the firer's claimers; "
                        "repeat it (default: 1 and 2)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    with migrated_postgres("chronos-claims-") as pg:
        if args.drain:
            runs = [lambda count=count: drain(pg.url, args.drain, count) for count in args.claimers or [1, 2]]
        else:
            runs = [lambda count=count: run(pg.url, count, args.rate, args.duration, args.warmup)
                    for count in args.firers or [1, 2, 4]]
        for measure in runs:
            row = measure()
            rows.append(row)
            print(orjson.dumps(row).decode(), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps({"date": time.strftime("%Y-%m-%d"),
                                           "command": "python -m benchmarks.claims " + " ".join(argv or sys.argv[1:]),
                                           "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
