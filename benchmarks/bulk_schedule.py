"""`python -m benchmarks.bulk_schedule`: the Spark pipeline's throughput.

    python -m benchmarks.bulk_schedule                       # 10 million rows, 10 million records
    python -m benchmarks.bulk_schedule --rows 1000000 --report-rows 1000000 --fsync both

1. Writes N message rows to parquet (ids, ISO and epoch-ms deadlines a day ahead, a key, a
   100-byte value, a JSON header per row).
2. Against an embedded PostgreSQL (fsync on by default, as in production), schedules them
   a) from one process without Spark, the same validation (`chronos.pipeline.rows.build`) and
      the same COPY path (`Store.insert`, 50,000 rows per transaction), and
   b) with `chronos pipeline schedule` on Spark (`--master`, default local[*]), into a fresh
      database, then once more (everything already waiting: the idempotent re-run).
   and reports rows per second, the ratio of b) to a), and the CPU time each used (this process
   with its children — the Spark JVM and Python workers —, and PostgreSQL): on a shared machine
   the CPU per row is the steadier figure.
3. Writes M delivery records like the SLA harness's records.parquet and times
   `chronos pipeline report` on them (wall time of the job in a started Spark session, and of
   the whole command with the JVM's start).

Figures are printed and written to OUT/bulk_schedule.json. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

CHUNK = 1_000_000
ROW_GROUP = 100_000  # Spark splits a parquet file at row groups


def write_messages(path: Path, n: int, seed: int = 1) -> None:
    """n rows in row groups of a million: the shape a real migration or backfill would have."""
    start_ms = int(time.time() * 1000) + 86_400_000
    rng = np.random.default_rng(seed)
    schema = pa.schema([("id", pa.string()), ("deadline", pa.string()), ("key", pa.string()),
                        ("value", pa.binary()), ("headers", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for lo in range(0, n, CHUNK):
            idx = np.arange(lo, min(n, lo + CHUNK))
            ms = start_ms + idx * 7 + rng.integers(0, 1000, idx.size)
            deadlines = ms.astype(str).astype(object)
            iso = np.datetime_as_string(ms.astype("datetime64[ms]"), unit="ms")
            deadlines[idx % 2 == 0] = np.char.add(iso[idx % 2 == 0], "Z")
            writer.write_table(pa.table({
                "id": pa.array(np.char.add("bulk-", idx.astype(str)).astype(object)),
                "deadline": pa.array(deadlines, pa.string()),
                "key": pa.array(np.char.add("customer-", (idx % 100_000).astype(str)).astype(object)),
                "value": pa.FixedSizeBinaryArray.from_buffers(
                    pa.binary(100), idx.size, [None, pa.py_buffer(rng.bytes(100 * idx.size))]).cast(pa.binary()),
                "headers": pa.array(np.char.add(np.char.add('{"trace": "', idx.astype(str)), '"}').astype(object)),
            }, schema=schema), row_group_size=ROW_GROUP)


def write_records(path: Path, n: int, seed: int = 2) -> None:
    """n delivery records over n / 20,000 seconds, as the SLA harness writes them (float seconds)."""
    rng = np.random.default_rng(seed)
    with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("deadline", pa.float64()), ("sent_at", pa.float64()),
                                           ("delivered_at", pa.float64()), ("copies", pa.int32())])) as writer:
        t0 = time.time()
        for lo in range(0, n, CHUNK):
            idx = np.arange(lo, min(n, lo + CHUNK))
            deadline = t0 + idx / 20_000.0
            writer.write_table(pa.table({
                "id": pa.array(idx, pa.int64()), "deadline": deadline, "sent_at": deadline - 5.0,
                "delivered_at": deadline + rng.lognormal(-5, 0.7, idx.size) - 0.005,
                "copies": pa.array(np.ones(idx.size, np.int32)),
            }), row_group_size=ROW_GROUP)


def fresh_database(server_url: str, name: str) -> str:
    from chronos.adapters.postgres.migrations import migrate
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = server_url.rsplit("/", 1)[0] + "/" + name
    migrate(url)
    return url


def count_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM chronos_messages").fetchone()[0]


def metered(pg_pid: int, fn):
    """Run fn(); returns (its result, CPU seconds of this process with its children — the Spark
    JVM and Python workers —, CPU seconds of PostgreSQL with its backends)."""
    from benchmarks.harness.procstat import CpuMeter
    meter = CpuMeter({"driver": (os.getpid(), True), "postgres": (pg_pid, True)})
    meter.start(time.monotonic())
    done = threading.Event()

    def sample() -> None:  # backends end with their connection: see them while they live
        while not done.wait(0.5):
            meter.sample()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    cpu = meter.stop(time.monotonic())
    return result, cpu["driver"]["cpu_s"], cpu["postgres"]["cpu_s"]


def single_process(path: Path, url: str, rules) -> dict:
    """The same rows through the same validation and COPY path, from one process, no Spark."""
    from chronos.pipeline.rows import build
    from chronos.adapters.postgres.store import Store

    store = Store(url)
    now_us = time.time_ns() // 1000
    validate_s = copy_s = 0.0
    inserted = read = 0
    started = time.perf_counter()
    for batch in pq.ParquetFile(path).iter_batches(batch_size=50_000):
        t = time.perf_counter()
        cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        ids, deadlines, keys, values, headers = cols
        rows = [build(ids[j], deadlines[j], None, None, headers[j], keys[j], values[j], now_us, rules)[0]
                for j in range(batch.num_rows)]
        validate_s += time.perf_counter() - t
        t = time.perf_counter()
        inserted += store.insert(rows)
        copy_s += time.perf_counter() - t
        read += batch.num_rows
    store.close()
    total = time.perf_counter() - started
    return {"rows": read, "inserted": inserted, "seconds": total, "rows_per_s": read / total,
            "validate_seconds": validate_s, "copy_seconds": copy_s, "copy_rows_per_s": read / copy_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="message rows to schedule (default 10M)")
    parser.add_argument("--report-rows", type=int, default=None, help="delivery records to report on (default: --rows)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--fsync", choices=("on", "off", "both"), default="on",
                        help="embedded PostgreSQL durability: on (production-like), off (fast=True), or both")
    parser.add_argument("--out", default="benchmarks/results", help="directory for bulk_schedule.json")
    parser.add_argument("--work-dir", default=None, help="where the data and PostgreSQL go (default: a temp dir)")
    parser.add_argument("--skip-single", action="store_true", help="skip the single-process baseline")
    parser.add_argument("--skip-report", action="store_true")
    parser.add_argument("--skip-schedule", action="store_true", help="time the report only")
    args = parser.parse_args(argv)

    from chronos.embedded.postgres import EmbeddedPostgres
    from chronos.domain.intake import Rules
    from chronos.pipeline import report, schedule
    from chronos.pipeline.spark import session

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="chronos-bulk-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"rows": args.rows, "master": args.master, "cpus": os.cpu_count(),
                     "load_average_at_start": os.getloadavg()}
    rules = Rules(timing_advance_us=50_000, output_topic="chronos.output", allowed_topics=re.compile(r"chronos\.output"))

    messages = work / "messages.parquet"
    if not args.skip_schedule:
        t = time.perf_counter()
        write_messages(messages, args.rows)
        print(f"wrote {args.rows:,} rows to {messages} ({messages.stat().st_size / 1e6:,.0f} MB) "
              f"in {time.perf_counter() - t:.1f} s", flush=True)

    spark = None  # started after the first single-process run, so the JVM's start is not in its CPU figures
    try:
        for fsync in () if args.skip_schedule else ("on", "off") if args.fsync == "both" else (args.fsync,):
            run: dict = {}
            pg = EmbeddedPostgres(work / f"pg-{fsync}", fast=fsync == "off", log_path=work / f"pg-{fsync}.log")
            pg.start()
            try:
                if not args.skip_single:
                    url = fresh_database(pg.url, "single")
                    run["single_process"], cpu, pg_cpu = metered(pg.pid, lambda: single_process(messages, url, rules))
                    run["single_process"].update(cpu_s=cpu, postgres_cpu_s=pg_cpu,
                                                 cpu_us_per_row=(cpu + pg_cpu) / args.rows * 1e6)
                    assert count_rows(url) == args.rows
                    print(f"[fsync {fsync}] single process: {run['single_process']['rows_per_s']:,.0f} rows/s "
                          f"({run['single_process']['copy_rows_per_s']:,.0f} rows/s in COPY alone)", flush=True)
                spark = spark or session(args.master, "chronos-bench")
                url = fresh_database(pg.url, "spark")
                first, cpu, pg_cpu = metered(pg.pid, lambda: schedule.run(
                    spark, input_path=str(messages), fmt="parquet", database_url=url, rules=rules, progress=True))
                assert first.stats.scheduled == args.rows == count_rows(url), first.stats
                again = schedule.run(spark, input_path=str(messages), fmt="parquet", database_url=url, rules=rules)
                assert again.stats.scheduled == 0 and again.stats.already_waiting == args.rows
                run["spark"] = {"seconds": first.seconds, "rows_per_s": first.rows_per_second,
                                "partitions": first.partitions, "rerun_seconds": again.seconds,
                                "rerun_rows_per_s": again.rows_per_second, "cpu_s": cpu, "postgres_cpu_s": pg_cpu,
                                "cpu_us_per_row": (cpu + pg_cpu) / args.rows * 1e6}
                if "single_process" in run:
                    run["spark"]["ratio_to_single_process"] = first.rows_per_second / run["single_process"]["rows_per_s"]
                    run["spark"]["ratio_to_copy_alone"] = (first.rows_per_second /
                                                          run["single_process"]["copy_rows_per_s"])
                print(f"[fsync {fsync}] spark {args.master}: {first.rows_per_second:,.0f} rows/s in "
                      f"{first.partitions} partitions; re-run (all waiting) {again.rows_per_second:,.0f} rows/s"
                      + (f"; {run['spark']['ratio_to_single_process']:.2f}x the single process"
                         if "single_process" in run else ""), flush=True)
            finally:
                pg.stop()
            results[f"fsync_{fsync}"] = run

        if not args.skip_report:
            n = args.report_rows or args.rows
            records = work / "records.parquet"
            write_records(records, n)
            spark = spark or session(args.master, "chronos-bench")
            t = time.perf_counter()
            out = report.run(spark, input_path=str(records), out_dir=work / "report")
            in_session = time.perf_counter() - t
            results["report"] = {"records": n, "seconds_in_session": in_session,
                                 "p999_ms": out["jitter_ms"]["p999"], "verdict": out["sla"]["verdict"]}
            print(f"report on {n:,} records: {in_session:.1f} s in a running session", flush=True)
    finally:
        if spark is not None:
            spark.stop()

    if not args.skip_report:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "chronos", "pipeline", "report", "--input", str(work / "records.parquet"),
                        "--out", str(work / "report-cli"), "--master", args.master], check=True,
                       stdout=subprocess.DEVNULL)
        results["report"]["seconds_cli"] = time.perf_counter() - t
        print(f"`chronos pipeline report` on {results['report']['records']:,} records: "
              f"{results['report']['seconds_cli']:.1f} s wall (JVM start included)", flush=True)

    results["load_average_at_end"] = os.getloadavg()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bulk_schedule.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
