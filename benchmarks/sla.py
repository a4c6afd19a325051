"""`python -m benchmarks.sla`: the SLA harness (throughput, jitter, losses) for Chronos, pgqueuer and graphile-worker.

    python -m benchmarks.sla --rate 1000 --duration 60                 # own `chronos up`, default delays 3:10 s
    python -m benchmarks.sla --ready-file .chronos/ready.json ...      # a stack that is already running
    python -m benchmarks.sla --find-max --max-rate 20000               # highest rate that holds the SLA
    python -m benchmarks.sla --target pgqueuer --rate 1000             # the same workload through pgqueuer
    python -m benchmarks.sla --target graphile --rate 1000             # ... through graphile-worker (Node)
    python -m benchmarks.sla --find-max --consumers 2 --firers 2 --detectors 2   # another layout
    python -m benchmarks.sla --rate 5000 -- --batch-size 5000          # after `--`: extra `chronos up` args

Processes: this one orchestrates and reports; a producer process offers the load; a reader
process stamps every output message on arrival (pgqueuer: worker processes stamp every job
run; graphile-worker: a Node worker reports every job run to a Python process that stamps
it); a probe process measures the broker's own produce→consume latency in the same run.
The step, its processes and its figures are the harness's (benchmarks/harness/step.py, report.py).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import orjson

from benchmarks.harness import report
from benchmarks.harness.database import wait_drained
from kits.stack import ChronosUp, External, OwnPostgres, StackFailed, layout_args, run_on
from benchmarks.harness.step import add_step_arguments, format_cpu, run_step
from benchmarks.harness.step import parse_args as parse_step_args
from benchmarks.harness.targets import TARGETS, Target, add_peer_arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sla", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Arguments after `--` are passed to `chronos up` unchanged, except --consumers, --firers "
                                       "and --detectors, which are taken as the harness's own.")
    p.add_argument("--target", choices=list(TARGETS), default="chronos")
    add_step_arguments(p)
    p.add_argument("--out", type=Path, help="output directory (default benchmarks/out/<time>-<target>)")
    g = p.add_argument_group("--find-max: doubling, then bisection, one short step each (in the layout above)")
    g.add_argument("--find-max", action="store_true")
    g.add_argument("--start-rate", type=float, default=1000.0)
    g.add_argument("--max-rate", type=float, default=40000.0)
    g.add_argument("--step-duration", type=float, default=20.0)
    g.add_argument("--max-steps", type=int, default=8)
    g.add_argument("--tolerance", type=float, default=0.1, help="stop bisecting within this fraction")
    g.add_argument("--reuse-stack", action="store_true",
                   help="run every step on one stack (by default a stack the harness starts is renewed between "
                        "steps: the embedded broker slows down as its topics fill, so a step would inherit the "
                        "load of the ones before)")
    add_peer_arguments(p)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The SLA study's options; `--consumers/--firers/--detectors` after `--` count as its own."""
    return parse_step_args(build_parser(), argv)


# ---------------------------------------------------------------------------------------------
# find-max


def find_max(target: Target, args: argparse.Namespace, out: Path, stack) -> dict:
    """Double the rate while the SLA holds, then bisect between the last pass and the first failure."""
    lo = hi = None
    best: dict | None = None
    rate = args.start_rate
    # The embedded broker's fetches slow down as its topics fill (docs/operations/embedded-stack.md), so on one stack
    # each step would inherit the previous steps' load; a stack the harness owns is renewed.
    fresh = not args.reuse_stack and hasattr(stack, "restart")
    steps = []
    while len(steps) < args.max_steps:
        step_out = out / "steps" / f"{len(steps) + 1:02d}-{int(rate)}"
        s = run_step(target, args, rate, args.step_duration, step_out, stack)
        failed = [k for k, v in s["sla"]["checks"].items() if not v]
        steps.append({"rate": rate, "layout": s["layout"], "sla_pass": s["sla_pass"], "failed": failed,
                      "jitter_p999_ms": (s["jitter_ms"] or {}).get("p999"), "lost": s["lost"],
                      "fire_rate": s["fire_rate"], "backlog_max": s["backlog"]["max"], "cpu": s["cpu"],
                      "dir": str(step_out)})
        if s["sla_pass"]:
            lo, best = rate, s
            best["_dir"] = step_out
        else:
            hi = rate
        if lo is not None and hi is not None and (hi - lo) / lo <= args.tolerance:
            break
        if hi is None:
            if rate >= args.max_rate:
                break
            nxt = min(rate * 2, args.max_rate)
        elif lo is None:
            nxt = rate / 2
            if nxt < 50:
                break
        else:
            nxt = (lo + hi) / 2
        rate = max(50.0, round(nxt / 50.0) * 50.0)
        if fresh:
            print("a fresh stack for the next step ...", flush=True)
            target = type(target)(args, stack.restart())
        else:
            wait_drained(target.database_url, target.table)
    result = {"target": target.name, "layout": steps[-1]["layout"], "max_sustained_rate": lo, "first_failing_rate": hi,
              "steps": steps,
              "step_duration_s": args.step_duration, "bounded_by_max_rate": hi is None and lo == args.max_rate}
    top = dict(best) if best is not None else {"target": target.name, "layout": result["layout"], "sla_pass": False}
    top.pop("_dir", None)
    top["find_max"] = result
    out.mkdir(parents=True, exist_ok=True)
    if best is not None:
        for name in ("records.parquet", "jitter.png"):
            if (best["_dir"] / name).exists():
                shutil.copy(best["_dir"] / name, out / name)
    (out / "summary.json").write_bytes(orjson.dumps(report.finite(top), option=orjson.OPT_INDENT_2))
    print("\n".join(find_max_lines(result)), flush=True)
    return top


def find_max_lines(result: dict) -> list[str]:
    """find-max's summary as printed: the verdict, then each step with its layout and CPU split."""
    lines = [f"find-max {result['target']} layout {result['layout']}: highest rate holding the SLA: "
             f"{result['max_sustained_rate']} msg/s (first failing: {result['first_failing_rate']}); steps:"]
    for st in result["steps"]:
        lines.append(f"  {st['rate']:>8g} msg/s  layout {st['layout']}  {'pass' if st['sla_pass'] else 'FAIL'}  "
                     f"p99.9 {st['jitter_p999_ms']} ms  lost {st['lost']}  {','.join(st['failed'])}")
        lines.append(f"           cpu (cores): {format_cpu(st['cpu'])}")
    return lines


# ---------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.rate <= 0 or args.duration <= 0:
        print("--rate and --duration must be positive", file=sys.stderr)
        return 2
    out = args.out or Path("benchmarks/out") / (datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                                                + f"-{args.target}")
    try:
        TARGETS[args.target].prepare()
    except StackFailed as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr, flush=True)
        return 3
    if args.ready_file:
        stack: ChronosUp | OwnPostgres | External = External(args.ready_file)
    elif args.target == "chronos":
        stack = ChronosUp(*layout_args(args.consumers, args.firers, args.detectors), *args.up_args)
    else:
        stack = OwnPostgres()

    def run(info: dict) -> dict:
        target = TARGETS[args.target](args, info)
        if args.find_max:
            return find_max(target, args, out, stack)
        return run_step(target, args, args.rate, args.duration, out, stack)
    code, summary = run_on(stack, run)
    if summary is None:
        return code
    return 0 if summary.get("sla_pass") else 1


if __name__ == "__main__":
    sys.exit(main())
