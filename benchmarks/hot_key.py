"""What a key that many waiting messages share costs each write, under each index of the key.

    python -m benchmarks.hot_key [--rows 300000] [--batch 5000] [--rounds 2] [--out FILE]

In an embedded PostgreSQL, for each index of the key (`hash`: the hash index on `key` of migrations 6 to 14;
`btree`: the B-tree of the key's hash of migration 15) and each kind of key (`hot`: every row the same key;
`unique`: each row its own), interleaved --rounds times: a fresh database, then --rows waiting rows written
through the consumer's store (`Store.apply`, the COPY) in batches of --batch. Reports, per arm, the medians
over the rounds of the milliseconds a batch took in the first and in the last tenth of the batches, and of
the whole time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import statistics
import time
import uuid
from datetime import date
from pathlib import Path

import psycopg

from benchmarks.harness.report import code_version, machine_info
from chronos.adapters.postgres.migrations import migrate
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Row

#: The index of the key each arm builds on the latest schema (which has none: `chronos key-search on` builds the B-tree).
INDEXES = {
    "btree": (QUERIES["create_key_search_index"],),
    "hash": ("CREATE INDEX chronos_messages_key ON chronos_messages USING hash (key) "
             "WHERE key IS NOT NULL AND readied_at IS NULL",),
}
KEYS = ("hot", "unique")
DAY_US = 86_400_000_000


def run(server_url: str, index: str, keys: str, rows: int, batch: int) -> list[float]:
    """The seconds each batch took, on a fresh database with `index`."""
    name = f"hot_{index}_{keys}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE hot_key_template")
    url = server_url.rsplit("/", 1)[0] + "/" + name
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in INDEXES[index]:
                conn.execute(statement)
        store = Store(url, node_id=uuid.uuid4())
        took: list[float] = []
        deadline = time.time_ns() // 1000 + 30 * DAY_US
        try:
            for b in range(0, rows, batch):
                written = [Row(f"m{i}", deadline + i, None, b"tenant-1" if keys == "hot" else b"customer-%d" % i,
                               b"v", b"", None, 0) for i in range(b, min(b + batch, rows))]
                started = time.perf_counter()
                store.apply(written, [], [])
                took.append(time.perf_counter() - started)
        finally:
            store.close()
        return took
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name}")


def summary(runs: list[list[float]]) -> dict:
    tenth = max(1, len(runs[0]) // 10)
    return {"first_tenth_batch_ms": round(statistics.median(statistics.median(r[:tenth]) for r in runs) * 1000, 1),
            "last_tenth_batch_ms": round(statistics.median(statistics.median(r[-tenth:]) for r in runs) * 1000, 1),
            "total_s": round(statistics.median(sum(r) for r in runs), 2), "rounds": len(runs)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=Path(".bench-hot-key"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/hot-key.json"))
    args = parser.parse_args(argv)

    from chronos.embedded.postgres import EmbeddedPostgres
    server = EmbeddedPostgres(args.data_dir / "data", log_path=args.data_dir / "postgres.log")
    server.start()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS hot_key_template")
            conn.execute("CREATE DATABASE hot_key_template")
        migrate(server.url.rsplit("/", 1)[0] + "/hot_key_template")
        took: dict[str, list[list[float]]] = {f"{i}-{k}": [] for i in INDEXES for k in KEYS}
        for r in range(args.rounds):
            arms = list(took) if r % 2 == 0 else list(reversed(took))
            for arm in arms:
                index, keys = arm.split("-")
                took[arm].append(run(server.url, index, keys, args.rows, args.batch))
                print(f"round {r + 1} {arm}: {sum(took[arm][-1]):.1f}s", flush=True)
    finally:
        server.stop()
    result = {"date": date.today().isoformat(), "rows": args.rows, "batch": args.batch,
              "command": "python -m benchmarks.hot_key " + " ".join(argv), "machine": machine_info(),
              "code": code_version(), "load_average_1m": round(os.getloadavg()[0], 2),
              "arms": {arm: summary(runs) for arm, runs in took.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for arm, s in result["arms"].items():
        print(f"{arm:14} first tenth {s['first_tenth_batch_ms']:8.1f} ms/batch, last tenth "
              f"{s['last_tenth_batch_ms']:8.1f} ms/batch, {s['total_s']:.1f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
