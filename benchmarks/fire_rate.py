"""`python -m benchmarks.fire_rate`: how fast the firers drain due rows, with and without a
store full of far-future rows.

    python -m benchmarks.fire_rate --due 200000                       # empty store
    python -m benchmarks.fire_rate --due 200000 --far 10000000        # 10 million rows due in two years

Starts its own `chronos up` (no consumer: rows are written straight into the store), fills in
`--far` rows due in about two years, then COPYs `--due` rows that are due at once and times the
firers until every one of them is published, acknowledged and deleted. Fire rate = due rows /
that time. It also reports each firer's resident memory at the end. Writes `--out DIR/fire_rate.json`.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import orjson
import psycopg

from benchmarks.harness.database import DAY_S, fill_far
from benchmarks.harness.procstat import rss_mb
from kits.stack import ChronosUp, layout_args, supervisor


def load_due(url: str, rows: int, payload: int) -> float:
    """COPY `rows` rows that are due now; returns the local time of the commit."""
    value = b"\xab" * payload
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            with cur.copy("COPY chronos_messages (id, deadline, key, value, headers) FROM STDIN") as copy:
                for i in range(rows):
                    copy.write_row((f"due-{i:09d}", "now", f"k{i}".encode(), value, b""))
        conn.commit()
    return time.time()


def remaining(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM chronos_messages WHERE id >= 'due-' AND id < 'due.'").fetchone()[0]


def programs_rss_mb(info: dict) -> dict[str, float]:
    """Resident memory (MB) of every supervisord program of the stack."""
    out = {}
    for proc in supervisor(info).programs():
        mb = rss_mb(proc["pid"])
        if mb is not None:
            out[proc["name"]] = mb
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fire_rate", description=__doc__.split("\n\n")[0])
    p.add_argument("--due", type=int, default=200_000, help="rows due at once (default 200,000)")
    p.add_argument("--far", type=int, default=0, help="rows due in two years, written first (default 0)")
    p.add_argument("--firers", type=int, default=1)
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds of draining")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out/fire_rate"))
    p.add_argument("up_args", nargs="*", help="after `--`: extra `chronos up` arguments")
    args = p.parse_args(argv)

    stack = ChronosUp(*layout_args(0, args.firers, 1), *args.up_args)
    info = stack.start()
    url = info["database_url"]
    result: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {_cores()} cores",
                    "due": args.due, "far": args.far, "firers": args.firers, "payload_bytes": args.payload_bytes}
    try:
        if args.far:
            print(f"writing {args.far:,} far-future rows ...", flush=True)
            result["far_fill_s"] = round(fill_far(url, args.far, ahead_s=730 * DAY_S, payload_bytes=args.payload_bytes,
                                                  progress=True), 1)
        print(f"writing {args.due:,} due rows ...", flush=True)
        committed = load_due(url, args.due, args.payload_bytes)
        with psycopg.connect(url, autocommit=True) as conn:
            left = args.due
            while left:
                if time.time() - committed > args.timeout:
                    raise SystemExit(f"not drained within {args.timeout:.0f}s: {left:,} left")
                time.sleep(0.05)
                left = remaining(conn)
        seconds = time.time() - committed
        result.update(drain_s=round(seconds, 2), fire_rate=round(args.due / seconds))
        result["rss_mb"] = programs_rss_mb(info)
        print(f"fired {args.due:,} rows in {seconds:.1f}s: {args.due / seconds:,.0f} msg/s "
              f"with {args.far:,} far-future rows waiting; memory (MB) {result['rss_mb']}", flush=True)
    finally:
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fire_rate.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


def _cores() -> int:
    import os
    return os.cpu_count() or 0


if __name__ == "__main__":
    raise SystemExit(main())
