"""Soak run: a steady load for a long time while a process of some role is SIGKILLed every so often.

    python -m benchmarks.soak                       # 10 minutes, 500 msg/s, a kill every 30 s
    python -m benchmarks.soak --minutes 2 --rate 300 --out soak.json

Runs `chronos up` (two consumers, two firers, two detectors, hold time 3 s) in a temporary
directory, produces a steady load (delays 0.5-5 s, 10% already late), SIGKILLs one program every
`--kill-every` seconds, rotating consumer → firer → detector, and reads the output topic. At the
end it reports: sent, delivered, lost, duplicates (and whether each is explained by a kill),
jitter percentiles (arrival on the output topic − deadline, for messages sent ahead of their
deadline), the recovery time of each kill, and each process's memory (RSS) at the start and the
end, the embedded PostgreSQL (with its backends) and broker included.

It uses the fault tests' harness (kits/faults.py), so the soak and the fault scenarios
count the same way.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import orjson

from kits.faults import Scenario
from kits.traffic import held_rows
from kits.figures import percentiles
from chronos.embedded.procs import descendants
from chronos.adapters.kafka.brokerstats import rss_bytes

ROLES = ("consumer", "firer", "detector")


def rss_kb(pid: int) -> int | None:
    return None if (rss := rss_bytes(pid)) is None else rss // 1024


def memory(sc: Scenario) -> dict[str, dict]:
    """RSS (kB) of every program (by name, with its pid), PostgreSQL (with backends) and the broker."""
    out: dict[str, dict] = {}
    for name, info in sorted(sc.stack.programs().items()):
        if info["pid"]:
            out[name] = {"pid": info["pid"], "rss_kb": rss_kb(info["pid"])}
    pg = sc.info.get("postgres_pid")
    if pg:
        out["postgres (all)"] = {"pid": pg, "rss_kb": sum(filter(None, (rss_kb(p) for p in [pg, *descendants(pg)])))}
    broker = sc.info.get("broker_pid")
    if broker:
        out["broker"] = {"pid": broker, "rss_kb": rss_kb(broker)}
    return out


def _ms(seconds: list[float]) -> dict | None:
    """Percentiles (in ms) of durations given in seconds."""
    return percentiles([v * 1000.0 for v in seconds])


def run(args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="chronos-soak-"))
    print(f"soak: {args.minutes} min at {args.rate} msg/s, a kill every {args.kill_every} s; in {workdir}", flush=True)
    # batched produces (linger 50 ms) and reads (fetch wait 50 ms), as docs/operations/embedded-stack.md explains for the embedded
    # broker: its fetch cost grows with the number of stored batches
    with Scenario("soak", workdir, "--consumers", "2", "--firers", "2", "--detectors", "2",
                  rate=args.rate, hold_s=3.0, linger_ms=args.linger_ms, fetch_wait_ms=50) as sc:
        time.sleep(10)
        mem_start = memory(sc)
        started = time.time()
        end = started + args.minutes * 60
        rotation = itertools.cycle([f"{role}_{n:02d}" for n in (0, 1) for role in ROLES])
        kills = []
        lags: list[tuple[float, int]] = []
        while time.time() + args.kill_every < end:
            time.sleep(args.kill_every)
            lags.append((round(time.time() - started), sc.lag()))
            name = next(rotation)
            role = name[:-3]
            if role == "consumer":
                f = sc.kill_consumer(name)
            elif role == "firer":
                f = sc.kill_firer(name)
            else:
                pid, at = sc.stack.kill_program(name)
                f = sc.fault(f"SIGKILL {name}", at)
                f.back_running = sc.stack.wait_running(name, not_pid=pid)[1]
            kills.append(f)
            print(f"  {time.time() - started:6.0f}s  input lag {lags[-1][1]:6d}  killed {name}"
                  + (f" holding {len(f.held)} rows" if f.held else "")
                  + f"; RUNNING again after {f.back_running - f.start:.1f}s", flush=True)
        time.sleep(max(0.0, end - time.time()))
        mem_end = memory(sc)
        lags.append((round(time.time() - started), sc.lag()))
        report = sc.finish(drain=args.drain)
        left = held_rows(sc.info["database_url"])
        running = sc.stack.all_running()
    sent = sc.load.sent
    arrivals = sc.reader.arrivals
    jitter = [min(arrivals[m]) - s.deadline for m, s in sent.items() if m in arrivals and s.deadline > s.produced]
    # where the time goes: Chronos producing (CreateTime - deadline), then the broker and the reader
    produced_late = [sc.reader.created[m] - s.deadline for m, s in sent.items()
                     if m in sc.reader.created and s.deadline > s.produced]
    read_after = [min(arrivals[m]) - sc.reader.created[m] for m in sent if m in sc.reader.created]
    near_kill = lambda due: any(f.start - 4.0 <= due <= f.start + 15.0 for f in kills)  # noqa: E731
    steady = [min(arrivals[m]) - s.deadline for m, s in sent.items()
              if m in arrivals and s.deadline > s.produced and not near_kill(s.due)]
    late_sent = [min(arrivals[m]) - s.produced for m, s in sent.items() if m in arrivals and s.deadline <= s.produced]
    result = {
        "minutes": args.minutes, "rate": args.rate, "kill_every_s": args.kill_every, "kills": len(kills),
        **{k: v for k, v in report.row().items() if k not in ("scenario", "faults")},
        "jitter": _ms(jitter),
        "jitter_away_from_kills": _ms(steady),
        "produced_vs_deadline": _ms(produced_late),
        "read_vs_produced": _ms(read_after),
        "already_late_publish_delay": _ms(late_sent),
        "running_again_s": {f"{i} {f.what}": round((f.back_running or f.start) - f.start, 2) for i, f in enumerate(kills)},
        "memory_kb": {"start": mem_start, "end": mem_end},
        "input_lag": lags,
        "rows_still_claimed_at_end": len(left),
        "programs_not_running_at_end": running,
        "lost_ids": report.lost[:100],
        "workdir": str(workdir),
    }
    return result


def _line(figures: dict | None) -> str:
    return "  ".join(f"{k} {v}" for k, v in figures.items()) if figures else "none"


def print_result(r: dict) -> None:
    print(f"\nsent {r['sent']}  delivered {r['delivered']}  lost {r['lost']} (found on the output topic when read "
          f"again: {r['lost_found_on_reread']})  early {r['early']}  "
          f"duplicates {r['duplicates']} (unexplained {r['unexplained_duplicates']})  kills {r['kills']}")
    print("jitter (arrival - deadline, ms): " + _line(r["jitter"]))
    print("  the same, messages due more than 4 s before or 15 s after any kill: " + _line(r["jitter_away_from_kills"]))
    print("  of which Chronos producing it (CreateTime - deadline, ms resolution): " + _line(r["produced_vs_deadline"]))
    print("  and the broker and reader (read - CreateTime): " + _line(r["read_vs_produced"]))
    print("already-late messages, send → arrival: " + _line(r["already_late_publish_delay"]))
    print(f"recovery (until the last message a kill delayed arrived): max {r['recovery_s']}s"
          f"; max lateness {r['max_lateness_s']}s")
    print("input lag (messages past the group's committed offsets) every kill: "
          + " ".join(str(n) for _, n in r["input_lag"]))
    print(f"{'process':<16} {'RSS start (MB)':>15} {'RSS end (MB)':>13}")
    for name in sorted(set(r["memory_kb"]["start"]) | set(r["memory_kb"]["end"])):
        a = r["memory_kb"]["start"].get(name, {})
        b = r["memory_kb"]["end"].get(name, {})
        fmt = lambda e: f"{e['rss_kb'] / 1024:.1f}" if e.get("rss_kb") else "-"  # noqa: E731
        restarted = " (restarted)" if a.get("pid") != b.get("pid") else ""
        print(f"{name:<16} {fmt(a):>15} {fmt(b):>13}{restarted}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=500.0, help="messages per second (default 500)")
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills (default 30)")
    parser.add_argument("--linger-ms", type=int, default=50, help="the load producer's linger.ms (default 50)")
    parser.add_argument("--drain", type=float, default=120.0,
                        help="seconds to wait past the last deadline for every message (default 120)")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    result = run(args)
    print_result(result)
    if args.out:
        args.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        print(f"written to {args.out}")
    ok = result["lost"] == 0 and result["early"] == 0 and result["unexplained_duplicates"] == 0 \
        and not result["programs_not_running_at_end"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
