"""One step of load on the system under test, measured: what the SLA study, the day and the longevity run
are made of, and the command-line options of such a step.

A step offers `rate` msg/s for `duration` s through the load producer (harness.kafka_load), waits until
every message acknowledged on the input has arrived on the output (or the drain timeout), and turns the
records into the summary (harness.report), with the CPU of every process (harness.procstat), the queue
table's statistics (harness.samplers) and, for Chronos, where each undelivered message is
(harness.accounting). Processes: the orchestrator (this one), the producer, the output reader and the
broker probe (pgqueuer: worker processes stamp every job run; graphile-worker: a Node worker reports every
job run to a Python process that stamps it).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import orjson

from benchmarks.harness import accounting, kafka_load, report
from benchmarks.harness.procstat import CpuMeter
from benchmarks.harness.records import ACKED, Records
from benchmarks.harness.samplers import TableSampler
from kits.stack import StackFailed
from benchmarks.harness.targets import LAYOUT_OPTIONS, ChronosTarget, Target


# ---------------------------------------------------------------------------------------------
# the options of a step


def parse_delay(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--delay wants MIN:MAX in seconds, got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"--delay wants 0 <= MIN <= MAX, got {text!r}")
    return lo, hi


def add_layout(parser) -> None:
    for name in LAYOUT_OPTIONS:
        parser.add_argument(f"--{name}", type=int, default=None, metavar="N",
                            help=f"`chronos up --{name}` (default 1)")


def resolve_layout(parser: argparse.ArgumentParser, args: argparse.Namespace, up_args: list[str]) -> None:
    """Settle args.consumers/firers/detectors (default 1) from the harness's options and those after
    `--`; args.up_args becomes the `chronos up` arguments left over."""
    after = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_layout(after)
    from_up, args.up_args = after.parse_known_args(up_args)
    for name in LAYOUT_OPTIONS:
        mine, theirs = getattr(args, name), getattr(from_up, name)
        if mine is not None and theirs is not None and mine != theirs:
            parser.error(f"--{name} {mine} and, after `--`, --{name} {theirs}: give it once")
        value = mine if mine is not None else theirs if theirs is not None else 1
        if value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
        setattr(args, name, value)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def add_step_arguments(p: argparse.ArgumentParser, probe_interval_ms: float = 25.0) -> None:
    """A step's options: the stack to drive or start, the load, and how it is measured."""
    p.add_argument("--ready-file", type=Path, help="drive this running stack instead of starting one")
    p.add_argument("--rate", type=float, default=1000.0, help="offered load, messages/s (default 1000)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--delay", type=parse_delay, default=(3.0, 10.0),
                   help="deadline = send time + uniform(MIN, MAX) s (default 3:10)")
    p.add_argument("--payload-bytes", type=int, default=100, help="value size (default 100)")
    g = p.add_argument_group("layout of the stack the harness starts; also taken from after `--`")
    add_layout(g)
    g = p.add_argument_group("measurement")
    add_measurement(g, probe_interval_ms=probe_interval_ms)


def add_measurement(g, drain_timeout: float = 30.0, probe_interval_ms: float = 25.0) -> None:
    """How a step is measured: the timing advance, the clients' batching, the probe, the drain (`drain_timeout`
    and `probe_interval_ms`: the study's defaults)."""
    g.add_argument("--timing-advance-ms", type=float, default=50.0,
                   help="the stack's timing advance: earlier than deadline - this counts as early (default 50)")
    g.add_argument("--fetch-wait-ms", type=int, default=5,
                   help="fetch.wait.max.ms of the output reader and the probe (default 5; see docs/operations/embedded-stack.md)")
    g.add_argument("--linger-ms", type=int, default=25,
                   help="linger.ms of the load producer (default 25: batched produces, as "
                        "docs/operations/embedded-stack.md explains; with 5 its many small batches made the embedded "
                        "broker's fetches slow for everyone)")
    g.add_argument("--probe-linger-ms", type=int, default=0,
                   help="linger.ms of the probe (default 0: the floor is the broker's own produce→readable time)")
    g.add_argument("--probe-interval-ms", type=float, default=probe_interval_ms,
                   help=f"one probe message every N ms (default {probe_interval_ms:g}; at 5 the probe's own tiny batches "
                        "loaded the broker)")
    g.add_argument("--drain-timeout", type=float, default=drain_timeout,
                   help=f"after the last deadline, wait this long for stragglers; the rest count as lost "
                        f"(default {drain_timeout:g})")
    g.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    g.add_argument("--no-records", action="store_true", help="skip records.parquet")
    g.add_argument("--seed", type=int, default=None)


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser`'s options from `argv`; `--consumers/--firers/--detectors` after `--` count as the harness's
    own, the other arguments after `--` become `args.up_args` (for `chronos up`)."""
    own, up_args = split_argv(argv)
    args = parser.parse_args(own)
    resolve_layout(parser, args, up_args)
    return args


# ---------------------------------------------------------------------------------------------
# one step


def run_step(target: Target, args: argparse.Namespace, rate: float, duration: float, out: Path | None,
             stack=None) -> dict:
    """Offer `rate` msg/s for `duration` s, wait for every due message, measure; returns the summary."""
    ctx = mp.get_context("spawn")
    count = max(1, int(round(rate * duration)))
    tag = uuid.uuid4().hex[:10]
    rec = Records.create(ctx, count)
    stop = ctx.Event()
    dmin, dmax = args.delay
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    layout = target.layout()
    sampler = TableSampler(target.database_url, target.table)
    sampler.start()
    helpers = target.start_consumers(ctx, tag, rec, stop)
    t0 = time.time() + 1.0
    plan = kafka_load.LoadPlan(tag=tag, rate=rate, count=count, t0=t0, delay_min=dmin, delay_max=dmax,
                               payload_bytes=args.payload_bytes, seed=seed)
    producer = target.producer(ctx, plan, rec)
    meter = CpuMeter({**target.cpu_groups(), **{p.name: (p.pid, False) for p in helpers}})
    date = report.now_iso()
    load_before = os.getloadavg()
    producer.start()
    meter.groups["bench-producer"] = (producer.pid, False)
    meter.start(time.time())
    print(f"step {tag}: {target.name} layout {layout} at {rate:g} msg/s for {duration:g} s, delay {dmin:g}:{dmax:g} s, "
          f"{count} messages", flush=True)
    try:
        drained = _watch(target, args, rec, producer, helpers, sampler, stack, t0, meter)
    except BaseException:
        producer.terminate()  # interrupted or failed: stop offering load at once
        raise
    finally:
        cpu = meter.stop(time.time())
        stop.set()
        for proc in [producer, *helpers]:
            proc.join(15)
            if proc.is_alive():
                print(f"{proc.name} did not stop; terminating it", flush=True)
                proc.terminate()
                proc.join(5)
        sampler.stop()
    probe = target.probe()
    target.drop_probe_topic()
    summary = report.summarize(rec, target=target.name, rate=rate, duration=duration, delay=args.delay,
                               timing_advance_ms=args.timing_advance_ms, probe=probe,
                               store_samples=sampler.samples, drain_timeout=args.drain_timeout, t0=t0)
    summary["drained"] = drained
    if summary["lost"] and isinstance(target, ChronosTarget):  # where each undelivered message is
        summary["undelivered"] = accounting.account_stack(accounting.undelivered_ids(rec, tag), target.info)
        print(accounting.render(summary["undelivered"]), flush=True)
        report.count_reread(summary, summary["undelivered"])
    summary["layout"] = layout
    summary["cpu"] = cpu
    summary["config"] = {"delay": f"{dmin:g}:{dmax:g}", "payload_bytes": args.payload_bytes, "seed": seed,
                         "tag": tag, "fetch_wait_ms": args.fetch_wait_ms, "linger_ms": args.linger_ms,
                         "probe_linger_ms": args.probe_linger_ms,
                         "probe_interval_ms": args.probe_interval_ms,
                         "counts": {"consumers": args.consumers, "firers": args.firers, "detectors": args.detectors},
                         "chronos_up_args": args.up_args, "target": target.config(), "argv": sys.argv[1:]}
    machine = report.machine_info()
    machine["loadavg_before"] = list(load_before)
    summary["machine"] = machine
    summary["code"] = report.code_version()
    summary["date"] = date
    summary = report.finite(summary)
    print_summary(summary)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        if not args.no_records:
            report.write_records(rec, out / "records.parquet")
        if not report.write_plot(rec, summary, probe, t0, out / "jitter.png"):
            print("matplotlib is not installed (pip install -e '.[bench]'): no jitter.png", flush=True)
        print(f"wrote {out}", flush=True)
    return summary


def _watch(target: Target, args: argparse.Namespace, rec: Records, producer, helpers: list, sampler: TableSampler, stack,
           t0: float, meter: CpuMeter) -> bool:
    """Show progress until every acknowledged message arrived, or the drain timeout; True if all arrived."""
    next_line = time.time() + args.progress
    next_cpu = time.time() + 1.0
    last_delivered, last_t = 0, time.time()
    while True:
        time.sleep(0.25)
        now = time.time()
        for proc in helpers:
            if not proc.is_alive():
                raise StackFailed(f"{proc.name} died (exit code {proc.exitcode})")
        if stack is not None:
            stack.check_alive()
        n, acked_n = int(rec.get("sent")), int(rec.get("acked"))
        delivered = int(np.count_nonzero(~np.isnan(rec.delivered_at[:n])))
        done = rec.get("producer_done") == 1.0
        if not producer.is_alive() and not done:
            raise StackFailed(f"the load producer died (exit code {producer.exitcode})")
        if now >= next_cpu:
            meter.sample()
            next_cpu = now + 1.0
        if now >= next_line:
            rate = (delivered - last_delivered) / max(now - last_t, 1e-9)
            last_delivered, last_t = delivered, now
            live = sampler.live_rows()
            print(f"[{now - t0:6.1f}s] sent {n:>8} acked {acked_n:>8}  delivered {delivered:>8} "
                  f"({rate:7.0f}/s)  overdue>0.5s {rec.overdue(now, 0.5):>6}  "
                  f"store ~{live if live is not None else '?':>7} rows", flush=True)
            next_line = now + args.progress
        if done:
            acked = rec.state[:n] == ACKED
            if int(np.count_nonzero(acked & np.isnan(rec.delivered_at[:n]))) == 0:
                return True
            last_deadline = float(np.nanmax(rec.deadline[:n])) if n else now
            if now > last_deadline + args.drain_timeout:
                return False


def format_cpu(cpu: dict) -> str:
    """Cores per process, busiest first, and their total: "postgres 0.42, firer_00 0.26 (total 0.68)"."""
    if not cpu:
        return "(not measured)"
    cores = sorted(((v["cores"], name) for name, v in cpu.items()), key=lambda c: (-c[0], c[1]))
    return ", ".join(f"{name} {c:.2f}" for c, name in cores) + f" (total {sum(c for c, _ in cores):.2f})"


def summary_lines(s: dict) -> list[str]:
    """The summary as printed: the verdict line, then the CPU split."""
    j, f = s.get("jitter_ms") or {}, s.get("broker_floor_ms") or {}
    floor = f"  broker floor p50/p99/p99.9 {f['p50']:.1f}/{f['p99']:.1f}/{f['p999']:.1f} ms" if f else ""
    reread = f" (found on the topic read again: {s['found_on_reread']})" if s.get("found_on_reread") else ""
    pub = s.get("publish_lateness_ms")
    if pub:
        floor += f"  publish lateness p99/p99.9 {pub['p99']:.0f}/{pub['p999']:.0f} ms"
    return [f"{s['target']} layout {s.get('layout', '?')} {s['offered_rate']:g} msg/s: sent {s['sent']} "
            f"delivered {s['delivered']} lost {s['lost']}{reread} "
            f"dup {s['duplicates']} early {s['early']} (published early {s['early_published']})  enqueue {s['enqueue_rate']}/s "
            f"(WAL {s.get('wal_bytes_per_message')} B/msg) "
            f"fire {s['fire_rate']}/s (due {s['due_rate']}/s)  jitter p50/p99/p99.9/max "
            f"{j.get('p50', math.nan):.1f}/{j.get('p99', math.nan):.1f}/{j.get('p999', math.nan):.1f}/"
            f"{j.get('max', math.nan):.1f} ms{floor}  backlog max {s['backlog']['max']}  "
            f"SLA {'PASS' if s['sla_pass'] else 'FAIL ' + ','.join(k for k, v in s['sla']['checks'].items() if not v)}",
            f"  cpu (cores): {format_cpu(s.get('cpu'))}"]


def print_summary(s: dict) -> None:
    print("\n".join(summary_lines(s)), flush=True)
