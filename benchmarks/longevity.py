"""`python -m benchmarks.longevity`: ONE stack, the same steady load step after step, until it has
carried millions of messages: does it keep its promises as it ages?

    python -m benchmarks.longevity --rate 4000 --duration 90 --steps 6          # the embedded default, 1/1/1
    python -m benchmarks.longevity --rate 4000 --steps 6 -- --consumers 2 --firers 2 --detectors 2
    python -m benchmarks.longevity --rate 1000 --duration 600 --steps 6 --fetch-wait-ms 100   # an hour at 1,000 msg/s
    python -m benchmarks.longevity --rate 4000 --steps 6 -- --partitions 4     # any `chronos up` argument
    python -m benchmarks.longevity --rate 10000 --duration 60 --steps 10 --renew-broker   # an aged database

Every step is a step of the harness (benchmarks/harness/step.py: its load generator, output reader, broker
probe and report, as the SLA study's) on the stack the steps before it aged; between steps the stack is not touched, unless
--renew-broker: then `chronos up` runs on a PostgreSQL of the benchmark's own (the embedded server with
`chronos up`'s settings, `--database-url`) and is stopped and started again between steps, so PostgreSQL
runs throughout and keeps all it carried (tables, indexes, their bloat and statistics, and its autovacuum
under way: a server restarted with the stack terminated every autovacuum of the table that took longer
than a step, and the table grew step after step) while the memory-only embedded broker starts empty.
That measures Chronos's part of a long-lived stack at rates the embedded broker alone could not carry for
long (docs/operations/embedded-stack.md), as it would be with a real Kafka whose retention frees what was
read. The
broker probe sends one message every 100 ms unless --probe-interval-ms says otherwise (PROBE_INTERVAL_MS). Per
step: messages carried so far (sent to the input topic), p99.9 jitter, the broker's floor p99.9 in the same
step, the firer's publish lateness (CreateTime - deadline) p50 and p99.9, the embedded broker's RSS,
lost messages (accounted for: benchmarks/harness/accounting.py), and the CPU of each part of the stack.
Results: a printed table and benchmarks/results/<date>/longevity-<layout>-<rate>.json (or --out).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

import orjson

from benchmarks.harness import report
from benchmarks.harness.database import table_mb
from benchmarks.harness.procstat import rss_mb
from kits.stack import ChronosOnPostgres, ChronosUp, External, layout_args, run_on
from benchmarks.harness.step import add_step_arguments, parse_args, run_step
from benchmarks.harness.targets import ChronosTarget

# The probe's own one-message batches pile up on its topic over a long step, and a reader at the head lists
# them all on every fetch: at the SLA study's 25 ms the probe made much of the broker's work in a long step
# (measured: docs/operations/embedded-stack.md#an-hour-at-1000-msgs).
PROBE_INTERVAL_MS = 100


def row(k: int, carried: int, s: dict, rss: float | None) -> dict:
    jitter, floor, publish = s.get("jitter_ms") or {}, s.get("broker_floor_ms") or {}, s.get("publish_lateness_ms") or {}
    cpu = s.get("cpu") or {}
    return {"cpu_cores": {name: v["cores"] for name, v in cpu.items()},
            "step": k, "messages_carried": carried, "sent": s["sent"], "jitter_p50_ms": jitter.get("p50"),
            "jitter_p999_ms": jitter.get("p999"), "floor_p999_ms": floor.get("p999"),
            "publish_p50_ms": publish.get("p50"), "publish_p999_ms": publish.get("p999"), "broker_rss_mb": rss,
            "lost": s["lost"], "fire_rate": s["fire_rate"], "sla_pass": s["sla_pass"],
            "undelivered": (s.get("undelivered") or {}).get("by_state")}


SCHEDULER = ("consumer", "firer", "detector", "postgres")  # the CPU the scheduler costs (not the broker's)


def scheduler_cores(cpu: dict[str, float]) -> float:
    """Cores of Chronos's processes and PostgreSQL in a step, out of its per-process CPU."""
    return round(sum(c for name, c in cpu.items() if name.startswith(SCHEDULER)), 3)


def table(rows: list[dict]) -> list[str]:
    head = ["step", "messages through the stack", "p99.9 jitter ms", "floor p99.9 ms",
            "publish lateness p50 / p99.9 ms", "Chronos + PostgreSQL cores", "table MB", "broker RSS MB", "lost",
            "SLA"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append(f"| {r['step']} | {r['messages_carried'] / 1e6:.2f} M | {r['jitter_p999_ms']} | {r['floor_p999_ms']} "
                     f"| {r['publish_p50_ms']} / {r['publish_p999_ms']} | {scheduler_cores(r['cpu_cores']):.2f} "
                     f"| {r.get('table_mb')} | {r['broker_rss_mb']} | {r['lost']} | {'pass' if r['sla_pass'] else 'fail'} |")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.longevity", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Arguments after `--` are passed to `chronos up` unchanged, except --consumers, --firers "
                                       "and --detectors, which are taken as the benchmark's own.")
    p.add_argument("--steps", type=int, default=6, help="steps of load (default 6)")
    p.add_argument("--renew-broker", action="store_true",
                   help="start `chronos up` again on the same data directory between steps (a fresh broker, the "
                        "same PostgreSQL)")
    add_step_arguments(p, probe_interval_ms=PROBE_INTERVAL_MS)
    p.add_argument("--out", type=Path, help="output directory (default benchmarks/out/<time>-longevity)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), list(sys.argv[1:] if argv is None else argv))
    if args.steps < 1 or args.rate <= 0 or args.duration <= 0:
        print("--steps, --rate and --duration must be positive", file=sys.stderr)
        return 2
    if args.renew_broker and args.ready_file:
        print("--renew-broker restarts the stack the benchmark starts; it cannot restart one given by --ready-file",
              file=sys.stderr)
        return 2
    layout = layout_args(args.consumers, args.firers, args.detectors)
    stack: ChronosUp | ChronosOnPostgres | External = External(args.ready_file) if args.ready_file else \
        ChronosOnPostgres(*layout, *args.up_args) if args.renew_broker else ChronosUp(*layout, *args.up_args)
    date = report.now_iso()
    base = args.out or Path("benchmarks/out") / (datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-longevity")

    def run(info: dict) -> dict:
        target = ChronosTarget(args, info)
        rows: list[dict] = []
        carried = 0
        for k in range(1, args.steps + 1):
            if isinstance(stack, ChronosOnPostgres) and k > 1:
                info = stack.renew()  # PostgreSQL runs on, with all it carried; the broker's data goes
                target = ChronosTarget(args, info)
            summary = run_step(target, args, args.rate, args.duration, base / f"step-{k:02d}", stack)
            carried += summary["sent"]
            rows.append({**row(k, carried, summary, rss_mb(info.get("broker_pid"))),
                         "table_mb": table_mb(target.database_url)})
            print("\n".join(table(rows)[-1:]), flush=True)
        return {"layout": target.layout(), "rows": rows}
    code, result = run_on(stack, run)
    if result is None:
        return code
    out = {"benchmark": "longevity", "date": date, "rate": args.rate, "step_duration_s": args.duration,
           "layout": result["layout"], "chronos_up_args": args.up_args,
           "broker": "renewed before each step (PostgreSQL running throughout)" if args.renew_broker
           else "one for all steps", "rows": result["rows"],
           "machine": report.machine_info(), "code": report.code_version()}
    print(f"\nlongevity, layout {result['layout']}, {args.rate:g} msg/s in steps of {args.duration:g} s:")
    print("\n".join(table(result["rows"])), flush=True)
    path = base / "longevity.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report.finite(out), option=orjson.OPT_INDENT_2))
    print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
