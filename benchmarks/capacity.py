"""`python -m benchmarks.capacity`: what a host must provide for Chronos, per unit of work.

    python -m benchmarks.capacity                     # 1,000,000 waiting messages; 10,000 msg/s for 60 s, 1/1/1
    python -m benchmarks.capacity --rows 10000000 --rate 5000 --duration 120 -- --consumers 2 --firers 2 --detectors 2

Two measurements, each on a stack of its own, written to one JSON file (`--out`):

- disk: `--rows` messages due in about a month, written through the consumer's own write path
  (`Store.insert`: 36-character ids, `--payload-bytes` values, a 12-byte key, one 16-byte header), then
  `VACUUM ANALYZE`; the table, each index and TOAST, in bytes and per million waiting messages.
- load: the SLA harness's workload (benchmarks/sla.py: delays 3-10 s, `--payload-bytes` values) at `--rate` for
  `--duration` s on a fresh `chronos up`; the WAL PostgreSQL wrote from the start of the load until every
  message was delivered (`pg_current_wal_lsn`, and `pg_stat_wal`'s full-page images), per message and per
  10,000 msg/s; the PostgreSQL sessions of every Chronos process in the middle of the load
  (`pg_stat_activity`, by `application_name`); the CPU of each process.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import psycopg

from benchmarks.harness import report
from kits.stack import ChronosUp, OwnPostgres, layout_args, run_on
from benchmarks.harness.step import add_step_arguments, run_step
from benchmarks.harness.step import parse_args as parse_step_args
from benchmarks.harness.targets import ChronosTarget

BATCH = 2000  # the consumer's batch (CHRONOS_BATCH_SIZE)


def rows(start: int, count: int, now_us: int, payload: int) -> list:
    """Messages like an application's: due in about a month, spread over a day."""
    from chronos import codec
    from chronos.domain.model import Row
    header = codec.encode_headers([("trace", os.urandom(16))])
    return [Row(str(uuid.uuid4()), now_us + 30 * 86400 * 10**6 + (i * 86400 * 10**6) // 1_000_000, None,
                f"customer-{i % 1000:03d}".encode(), os.urandom(payload), header)
            for i in range(start, start + count)]


def sizes(url: str) -> dict:
    """chronos_messages: the heap, TOAST, each index, and all of them (bytes)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE chronos_messages")
        heap, total, toast = conn.execute(
            "SELECT pg_relation_size(c.oid), pg_total_relation_size(c.oid), "
            "coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0) "
            "FROM pg_class c WHERE c.relname = 'chronos_messages'").fetchone()
        indexes = dict(conn.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
            "WHERE indrelid = 'chronos_messages'::regclass ORDER BY 1").fetchall())
    return {"heap": heap, "toast": toast, "indexes": indexes, "total": total}


def measure_disk(count: int, payload: int) -> dict:
    from chronos.adapters.postgres.migrations import migrate
    from chronos.adapters.postgres.store import Store

    def body(info: dict) -> dict:
        url = info["database_url"]
        migrate(url)
        store = Store(url)
        now_us = int(time.time() * 1e6)
        started = time.monotonic()
        for done in range(0, count, BATCH):
            store.insert(rows(done, min(BATCH, count - done), now_us, payload))
            if done and done % 200_000 == 0:
                print(f"  {done:,} rows", flush=True)
        seconds = time.monotonic() - started
        store.close()
        got = sizes(url)
        per_million = {k: (round(v * 1e6 / count) if isinstance(v, int) else {i: round(b * 1e6 / count)
                                                                                 for i, b in v.items()})
                       for k, v in got.items()}
        print(f"{count:,} waiting messages: {got['total'] / 2**20:,.0f} MB in all "
              f"({per_million['total'] / 2**20:,.0f} MB per million), written in {seconds:.0f} s", flush=True)
        return {"rows": count, "payload_bytes": payload, "bytes": got, "bytes_per_million": per_million,
                "write_s": round(seconds, 1)}
    code, result = run_on(OwnPostgres(), body)
    if result is None:
        raise SystemExit(code)
    return result


WAL_STATS = "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"


def sessions(url: str) -> dict[str, list[int]]:
    """Each role's processes and how many PostgreSQL sessions each holds (application_name `chronos ROLE NODE`)."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT application_name, count(*) FROM pg_stat_activity "
                             "WHERE application_name LIKE 'chronos %' GROUP BY 1").fetchall()
    by_role: dict[str, list[int]] = {}
    for name, n in found:
        role = name.split()[1] if len(name.split()) > 1 else name
        by_role.setdefault(role, []).append(n)
    return {role: sorted(counts) for role, counts in sorted(by_role.items())}


def measure_load(args: argparse.Namespace) -> dict:
    stack = ChronosUp(*layout_args(args.consumers, args.firers, args.detectors), *args.up_args)

    def body(info: dict) -> dict:
        url = info["database_url"]
        target = ChronosTarget(args, info)
        seen: dict[str, list[int]] = {}
        mid = threading.Timer(1.0 + args.duration / 2, lambda: seen.update(sessions(url)))
        with psycopg.connect(url, autocommit=True) as conn:
            before = conn.execute(WAL_STATS).fetchone()
            mid.start()
            try:
                summary = run_step(target, args, args.rate, args.duration, None, stack)
            finally:
                mid.cancel()
            after = conn.execute(WAL_STATS).fetchone()
            wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)::bigint", (after[0], before[0])).fetchone()[0]
            checkpoint = conn.execute("SHOW max_wal_size").fetchone()[0], \
                conn.execute("SHOW checkpoint_timeout").fetchone()[0]
        sent = summary["sent"]
        per_message = wal / sent
        cpu = {name: v["cores"] for name, v in (summary.get("cpu") or {}).items()}
        result = {"rate": args.rate, "duration_s": args.duration, "layout": summary["layout"], "sent": sent,
                  "lost": summary["lost"], "sla_pass": summary["sla_pass"],
                  "wal_bytes": wal, "wal_bytes_per_message": round(per_message),
                  "wal_mb_per_s_at_10000": round(per_message * 10_000 / 2**20, 2),
                  "wal_records": after[1] - before[1], "wal_full_page_images": after[2] - before[2],
                  "max_wal_size": checkpoint[0], "checkpoint_timeout": checkpoint[1],
                  "sessions": seen, "cpu_cores": cpu,
                  "scheduler_cores_per_10000": round(sum(c for n, c in cpu.items() if n.startswith(
                      ("consumer", "firer", "detector", "postgres"))) * 10_000 / args.rate, 3)}
        print(f"WAL: {per_message:,.0f} bytes per message, {result['wal_mb_per_s_at_10000']} MB/s at 10,000 msg/s "
              f"({result['wal_full_page_images']:,} full-page images); sessions {seen}; "
              f"Chronos + PostgreSQL {result['scheduler_cores_per_10000']} cores per 10,000 msg/s", flush=True)
        return result
    code, result = run_on(stack, body)
    if result is None:
        raise SystemExit(code)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--rows", type=int, default=1_000_000, help="waiting messages for the disk figures")
    own.add_argument("--result", type=Path, default=None,
                     help="the JSON file to write (default benchmarks/out/<time>-capacity/capacity.json)")
    mine, rest = own.parse_known_args(argv)
    if not any(a.startswith("--rate") for a in rest):
        rest = ["--rate", "10000", *rest]
    if not any(a.startswith("--duration") for a in rest):
        rest = ["--duration", "60", *rest]
    step = argparse.ArgumentParser(prog="python -m benchmarks.capacity", add_help=False)
    add_step_arguments(step)
    args = parse_step_args(step, rest)
    date = report.now_iso()
    print(f"disk: {mine.rows:,} waiting messages", flush=True)
    disk = measure_disk(mine.rows, args.payload_bytes)
    print(f"load: {args.rate:g} msg/s for {args.duration:g} s", flush=True)
    load = measure_load(args)
    out = {"benchmark": "capacity", "date": date, "command": "python -m benchmarks.capacity " + " ".join(argv),
           "disk": disk, "load": load, "machine": report.machine_info(), "code": report.code_version()}
    path = mine.result or Path("benchmarks/out") / (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-capacity") \
        / "capacity.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report.finite(out), option=orjson.OPT_INDENT_2))
    print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
