"""What a connection pooler costs the hot path, by pool mode (docs/operations/poolers.md): the same rounds
of the consumer's and the firer's statements straight to PostgreSQL, through Debian's PgBouncer in session
mode, and through it in transaction mode (CHRONOS_DATABASE_POOL_MODE=transaction), the latter also as it
runs where libpq has no pipeline mode (each statement and its settings in an explicit transaction).

One round, on the processes' own stores (`Store` with the roles' settings): the consumer COPYs a batch of
new rows (due already), then replaces them (its staging table), the firer claims them and deletes them.
The ways take their rounds in turn, so that the shared machine's load falls on all of them alike; the
first rounds warm up and are not counted, and the table is vacuumed every few rounds, untimed. Prints the
median of each statement and of a whole round, in milliseconds, and each way's against the direct one.

    python -m benchmarks.pooler [--rounds 100] [--batch 2000] [--batch 10] [--durable]

PostgreSQL is the embedded one (fsync off unless --durable), PgBouncer runs as kits/pgbouncer.py runs
it (the Makefile's `pgbouncer` target installs it); all three on this machine, over TCP to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from chronos.adapters.postgres import pooling, session
from chronos.adapters.postgres.migrations import migrate
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Row
from chronos.embedded.postgres import EmbeddedPostgres
from chronos.runtime.process import tune_gc
from kits.pgbouncer import PgBouncer

from benchmarks.harness.database import database_url_for

STEPS = ("insert", "replace", "claim", "delete")
WARM_ROUNDS = 5
VACUUM_EVERY = 10  # rounds: every round deletes what it inserted
VALUE = b"x" * 100


class Way:
    """One way to PostgreSQL: a consumer's and a firer's store, and the times of each step."""

    def __init__(self, name: str, url: str, mode: str, *, pipeline: bool = True):
        self.name, self.pipeline = name, pipeline
        self.consumer = Store(url, node_id=uuid.uuid4(), hot_path=True, pool_mode=mode)
        self.firer = Store(url, node_id=uuid.uuid4(), hot_path=True, synchronous_commit=False, pool_mode=mode)
        self.times: dict[str, list[float]] = {step: [] for step in (*STEPS, "round")}

    def round(self, batch: int, counted: bool) -> None:
        session.PIPELINE = self.pipeline and psycopg.Pipeline.is_supported()
        run = uuid.uuid4().hex[:8]
        due = time.time_ns() // 1000 - 1_000_000
        rows = [Row(f"{run}-{i}", due, None, b"k", VALUE, b"") for i in range(batch)]
        again = [Row(r.id, r.deadline_us, None, b"k", b"y" * 100, b"") for r in rows]
        took: dict[str, float] = {}
        started = t = time.perf_counter()
        assert self.consumer.apply(rows, [], []) == (batch, 0, 0, 0)
        took["insert"], t = time.perf_counter() - t, time.perf_counter()
        assert self.consumer.apply([], again, []) == (0, batch, 0, 0)
        took["replace"], t = time.perf_counter() - t, time.perf_counter()
        claimed = self.firer.claim(batch, 0)
        took["claim"], t = time.perf_counter() - t, time.perf_counter()
        assert len(claimed) == batch, len(claimed)
        assert self.firer.delete_fired(claimed) == batch
        took["delete"] = time.perf_counter() - t
        took["round"] = time.perf_counter() - started
        if counted:
            for step, seconds in took.items():
                self.times[step].append(seconds * 1000)

    def close(self) -> None:
        self.consumer.close()
        self.firer.close()


def measure(server_url: str, bouncers: dict[str, PgBouncer], rounds: int, batch: int) -> list[Way]:
    """`rounds` rounds of `batch` rows on each way, in turn, in a database of their own."""
    name = f"bench_pooler_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = database_url_for(server_url, name)
    migrate(url)
    ways = [Way("direct", url, pooling.SESSION),
            Way("pgbouncer session", bouncers["session"].url(url), pooling.SESSION),
            Way("pgbouncer transaction", bouncers["transaction"].url(url), pooling.TRANSACTION),
            Way("  without pipeline", bouncers["transaction"].url(url), pooling.TRANSACTION, pipeline=False)]
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            for i in range(WARM_ROUNDS + rounds):
                for way in ways:
                    way.round(batch, counted=i >= WARM_ROUNDS)
                if i % VACUUM_EVERY == VACUUM_EVERY - 1:
                    admin.execute("VACUUM chronos_messages")
    finally:
        for way in ways:
            way.close()
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return ways


def report(ways: list[Way], rounds: int, batch: int) -> str:
    direct = {step: statistics.median(times) for step, times in ways[0].times.items()}
    lines = [f"batch {batch} rows, {rounds} rounds: median ms (x direct)",
             f"{'':<22}" + "".join(f"{step:>17}" for step in (*STEPS, "round"))]
    for way in ways:
        cells = []
        for step in (*STEPS, "round"):
            median = statistics.median(way.times[step])
            cells.append(f"{median:9.3f} ({median / direct[step]:4.2f})")
        lines.append(f"{way.name:<22}" + "".join(f"{cell:>17}" for cell in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pooler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--batch", type=int, action="append", help="rows per round (repeatable; default 2000 and 10)")
    parser.add_argument("--durable", action="store_true", help="fsync and synchronous commits on, as in production")
    args = parser.parse_args(argv)
    tune_gc()  # as a role's process runs
    with tempfile.TemporaryDirectory(prefix="chronos-bench-pooler-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "data", fast=not args.durable, log_path=Path(tmp) / "postgres.log")
        server.start()
        try:
            with PgBouncer(server.port, "session") as session, PgBouncer(server.port, "transaction") as transaction:
                for batch in args.batch or [2000, 10]:
                    ways = measure(server.url, {"session": session, "transaction": transaction}, args.rounds, batch)
                    print(report(ways, args.rounds, batch), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
