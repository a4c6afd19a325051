"""`python -m benchmarks.day`: a day in the life of ONE long-lived `chronos up` stack, phase by phase.

    python -m benchmarks.day                                          # the full sequence, one process per role
    python -m benchmarks.day --consumers 2 --firers 2 --detectors 2   # two of every role
    python -m benchmarks.day --scale 0.1                              # every duration and count x 0.1 (a smoke run)
    python -m benchmarks.day --ready-file .chronos/ready.json --metrics-port 9400   # a stack already running
    python -m benchmarks.day --table benchmarks/results/2026-11-23/day-1x1x1.json   # the table of a past run

Phases, in this order, on one stack that is never restarted:
  steady        1,000 msg/s for 60 s
  burst 1..3    10,000 msg/s for 15 s, each followed by 40 s of quiet
  spike         200,000 messages all due at the same instant, sent in the 30 s before it
  far-future    1,000,000 rows due in a year written in bulk (COPY through the store: harness.database.fill_far),
                then 5,000 msg/s for 60 s
  VACUUM        5,000 msg/s for 60 s, a manual VACUUM of the table during it
  autovacuum    5,000 msg/s for 60 s and until an autovacuum of the table has run (its thresholds and
                autovacuum_naptime lowered for the phase, then restored)

Per phase: jitter p50/p99/p99.9 and the broker floor of the same phase (the SLA harness's probe), the
slowest claim, delete, detector scan and consumer insert (from the processes' /metrics), duplicates,
messages more than 60 s late, lost ones; the spike adds its drain time and fire rate. With the embedded
broker (the stats file `chronos up` writes): the messages it held at the phase's end and how many went
through it during the phase, its memory (RSS) at the end and the most, its CPU, and the intake lag (the
most input messages the consumer group had not read yet, sampled every few seconds). The load
generator, output reader and probe are the harness's (benchmarks/harness/kafka_load.py); see
benchmarks/harness/report.py for how jitter and the floor are measured. Results: a printed table and
benchmarks/results/<date>/day-<layout>.json (or --out).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import random
import re
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import orjson

from benchmarks.harness import accounting, kafka_load, report
from benchmarks.harness.database import fill_far
from benchmarks.harness.procstat import CpuMeter
from benchmarks.harness.records import ACKED, FAILED, Records
from benchmarks.harness.samplers import BrokerSampler, TableSampler
from kits.stack import ChronosUp, External, StackFailed, layout_args, run_on
from benchmarks.harness.step import add_layout, add_measurement, parse_delay, resolve_layout, split_argv
from benchmarks.harness.targets import ChronosTarget, wait_ready
from chronos.telemetry.endpoints import pick_metrics_base

TABLE = "chronos_messages"
LATE_BOUND_S = 60.0
STATEMENT_BOUND_S = 1.0
# what the report calls each timed step of the processes: (role, step of chronos_batch_duration_seconds)
STATEMENTS = {"claim": ("firer", "claim"), "delete": ("firer", "delete"), "scan": ("detector", "scan"),
              "insert": ("consumer", "insert")}
COUNTERS = {"reset": "chronos_messages_reset_total", "vanished": "chronos_messages_vanished_total",
            "released": "chronos_messages_released_total"}
# lowered for the autovacuum phase only, so that an autovacuum comes within seconds
AUTOVACUUM_OPTIONS = {"autovacuum_vacuum_threshold": "1000", "autovacuum_vacuum_scale_factor": "0",
                      "autovacuum_vacuum_insert_threshold": "1000", "autovacuum_vacuum_insert_scale_factor": "0",
                      "autovacuum_analyze_threshold": "1000", "autovacuum_analyze_scale_factor": "0"}
NUMBER = re.compile(r"^-?[0-9.]+(e-?[0-9]+)?$")


@dataclass(frozen=True)
class Phase:
    """One phase: `rate` msg/s for `duration` s, then `quiet` s (None: until its messages arrived)."""

    name: str
    rate: float
    duration: float
    quiet: float | None = None
    spike_ahead: float | None = None   # every deadline this long after the load starts
    far_rows: int = 0                  # rows due in a year, written in bulk before the load
    event: str | None = None           # "vacuum" or "autovacuum", during the load; the load lasts until it ended
    max_duration: float | None = None  # the longest an event may stretch the load

    @property
    def capacity(self) -> int:
        return max(1, int(math.ceil(self.rate * (self.max_duration or self.duration))))


def phases(scale: float) -> list[Phase]:
    """The sequence, every duration and count times `scale` (rates unchanged)."""
    def s(seconds: float, floor: float = 1.0) -> float:
        return max(floor, round(seconds * scale, 2))

    # at a small scale, still seconds ahead: a producer that starts late on a loaded machine sends its
    # messages at once, and with too little time ahead every one of them reaches the consumer already due
    ahead = s(30.0, 6.0)
    spike = max(1, int(200_000 * scale))
    return [
        Phase("steady 1k", 1000.0, s(60.0)),
        *[Phase(f"burst {k}", 10000.0, s(15.0, 0.5), quiet=s(40.0, 2.0)) for k in (1, 2, 3)],
        Phase("spike", spike / (ahead / 2), ahead / 2, spike_ahead=ahead),
        Phase("far-future 5k", 5000.0, s(60.0), far_rows=max(1, int(1_000_000 * scale))),
        Phase("VACUUM 5k", 5000.0, s(60.0), event="vacuum", max_duration=max(s(60.0) * 2, 30.0)),
        Phase("autovacuum 5k", 5000.0, s(60.0), event="autovacuum", max_duration=max(s(60.0) * 2, 30.0)),
    ]


# ---------------------------------------------------------------------------------------------
# the arithmetic (pure: tests/unit/test_day_report.py)


def parse_metrics(text: str) -> dict:
    """From one process's /metrics text: per step {count, le: {bound: cumulative count}, max}, its
    counters and node id."""
    from prometheus_client.parser import text_string_to_metric_families
    steps: dict[str, dict] = {}
    counters: dict[str, float] = {}
    node = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            step = sample.labels.get("step")
            node = sample.labels.get("node", node)
            if sample.name == "chronos_batch_duration_seconds_bucket":
                steps.setdefault(step, _empty_step())["le"][float(sample.labels["le"])] = sample.value
            elif sample.name == "chronos_batch_duration_seconds_count":
                steps.setdefault(step, _empty_step())["count"] = sample.value
            elif sample.name == "chronos_batch_duration_max_seconds":
                steps.setdefault(step, _empty_step())["max"] = sample.value
            elif sample.name in COUNTERS.values():
                counters[sample.name] = sample.value
    return {"node": node, "steps": steps, "counters": counters}


def _empty_step() -> dict:
    return {"count": 0.0, "le": {}, "max": 0.0}


def step_figures(before: dict, after: dict) -> dict:
    """One process's batches of one step between two scrapes: how many, how many over 1 s, and the
    slowest. The slowest is exact when the process's running maximum rose in between; otherwise it is
    bounded by the smallest histogram bucket that holds every batch of the window, and by that
    maximum (`exact` False)."""
    count = after["count"] - before["count"]
    if count < 0:  # the process restarted: everything since is in `after`
        before, count = _empty_step(), after["count"]
    if count <= 0:
        return {"count": 0, "over_1s": 0, "slowest_s": None, "exact": True}
    le_after, le_before = after["le"], before["le"]
    under = {b: le_after.get(b, 0.0) - le_before.get(b, 0.0) for b in le_after}
    over = int(count - under.get(STATEMENT_BOUND_S, 0.0))
    if after["max"] > before["max"]:
        slowest, exact = after["max"], True
    else:
        finite = sorted(b for b, n in under.items() if math.isfinite(b) and n >= count)
        slowest, exact = (min(finite[0], after["max"]), False) if finite else (after["max"], False)
    return {"count": int(count), "over_1s": over, "slowest_s": round(slowest, 4), "exact": exact}


def statement_figures(before: dict[str, dict], after: dict[str, dict]) -> dict:
    """Per statement of STATEMENTS, over every process (keyed by program name) scraped at both ends of a
    phase: batches, batches over 1 s, the slowest (and whether exact); plus the counters' increase."""
    out: dict = {}
    for label, (role, step) in STATEMENTS.items():
        total = {"count": 0, "over_1s": 0, "slowest_s": None, "exact": True}
        for name, end in after.items():
            if not name.startswith(role) or step not in end["steps"]:
                continue
            start = before.get(name)
            start_step = start["steps"].get(step, _empty_step()) if start and start["node"] == end["node"] \
                else _empty_step()
            f = step_figures(start_step, end["steps"][step])
            total["count"] += f["count"]
            total["over_1s"] += f["over_1s"]
            if f["slowest_s"] is not None and (total["slowest_s"] is None or f["slowest_s"] > total["slowest_s"]):
                total["slowest_s"], total["exact"] = f["slowest_s"], f["exact"]
        out[label] = total
    counters = {}
    for label, metric in COUNTERS.items():
        n = 0.0
        for name, end in after.items():
            start = before.get(name)
            was = start["counters"].get(metric, 0.0) if start and start["node"] == end["node"] else 0.0
            n += max(0.0, end["counters"].get(metric, 0.0) - was)
        counters[label] = int(n)
    out["counters"] = counters
    return out


def phase_figures(rec: Records, *, window: tuple[float, float], probe: tuple[np.ndarray, np.ndarray] | None,
                  timing_advance_ms: float, spike_deadline: float | None = None) -> dict:
    """A phase's messages (whenever they arrived) and the broker floor while the phase ran.

    late_over_60s: delivered more than 60 s after the deadline, or not delivered at all (lost ones
    included). For a spike: drain_s = last arrival - the common deadline, fire_rate = messages /
    (last - first arrival).
    """
    n = int(rec.get("sent"))
    state, deadline = rec.state[:n], rec.deadline[:n]
    delivered_at, created_at, copies = rec.delivered_at[:n], rec.created_at[:n], rec.copies[:n]
    acked = state == ACKED
    got = ~np.isnan(delivered_at)
    jitter = (delivered_at[got] - deadline[got]) * 1000.0
    lost = int(np.count_nonzero(acked & ~got))
    with np.errstate(invalid="ignore"):
        has_created = got & ~np.isnan(created_at)
        early_published = int(np.count_nonzero(
            created_at[has_created] * 1000.0 < np.round(deadline[has_created] * 1000.0) - timing_advance_ms))
    out = {
        "sent": int(np.count_nonzero(acked)),
        "send_failed": int(np.count_nonzero(state == FAILED)),
        "delivered": int(np.count_nonzero(got)),
        "lost": lost,
        "duplicates": int(copies[got].sum()) - int(np.count_nonzero(got)),
        "early": int(np.count_nonzero(jitter < -timing_advance_ms)),
        "early_published": early_published,
        "late_over_60s": int(np.count_nonzero(jitter > LATE_BOUND_S * 1000.0)) + lost,
        "jitter_ms": report.percentiles(jitter),
        # when the firer published (the output message's CreateTime) minus the deadline: the
        # scheduler's own share of the jitter, apart from what the broker and the reader add
        "publish_lateness_ms": report.percentiles((created_at[has_created] - deadline[has_created]) * 1000.0),
        "broker_floor_ms": None,
    }
    if probe is not None:
        p_sent, p_lat = probe
        inside = (p_sent >= window[0]) & (p_sent < window[1])
        out["broker_floor_ms"] = report.percentiles(p_lat[inside] * 1000.0)
    if spike_deadline is not None and got.any():
        first, last = float(delivered_at[got].min()), float(delivered_at[got].max())
        out["spike"] = {"drain_s": round(last - spike_deadline, 3),
                        "fire_rate": round(out["delivered"] / max(last - first, 1e-3), 1),
                        "first_arrival_s": round(first - spike_deadline, 3)}
    return out


def broker_figures(samples: list[tuple[float, int | None, int | None, int | None]], start: float, end: float,
                   cpu: dict | None) -> dict | None:
    """The embedded broker during [start, end) from samples (time, rss bytes, messages held, input
    messages not read yet; None where unknown) and the phase's CPU figures (its "broker" group): the
    messages held at the end and how many went through it (held at the end - held before the phase),
    the RSS at the end and the most, its CPU cores, the most input messages not read yet. None without
    samples in the phase (no embedded broker)."""
    inside = [x for x in samples if start <= x[0] < end]
    if not inside:
        return None
    before = [x for x in samples if x[0] < start and x[2] is not None][-1:]
    held = [x[2] for x in inside if x[2] is not None]
    rss = [x[1] for x in inside if x[1] is not None]
    unread = [x[3] for x in inside if x[3] is not None]
    return {"messages_held": held[-1] if held else None,
            "messages_through": held[-1] - (before[0][2] if before else held[0]) if held else None,
            "rss_mb": round(rss[-1] / 2 ** 20, 1) if rss else None,
            "rss_mb_max": round(max(rss) / 2 ** 20, 1) if rss else None,
            "cpu_cores": ((cpu or {}).get("broker") or {}).get("cores"),
            "intake_lag_max": max(unread) if unread else None}


def targets(phase: dict) -> dict[str, bool]:
    """The issue's targets for one phase (the spike is exempt from the p99.9 bound)."""
    j = phase.get("jitter_ms") or {}
    statements = phase.get("statements")
    checks = {
        "none_over_60s_late": phase["late_over_60s"] == 0,
        "no_duplicates": phase["duplicates"] == 0,
        "nothing_lost": phase["lost"] == 0,
        "nothing_early": phase["early"] == 0,
    }
    if statements:  # measured: the processes' /metrics could be read
        checks["statements_under_1s"] = all(statements[k]["over_1s"] == 0 for k in ("claim", "delete", "scan"))
    if not phase["name"].startswith("spike"):
        checks["p999_within_500ms"] = bool(j) and j["p999"] <= report.SLA_P999_MS
    return checks


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _count(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _slowest(st: dict | None) -> str:
    if not st or st.get("slowest_s") is None:
        return "-"
    return ("" if st["exact"] else "≤") + f"{st['slowest_s']:.3f}" + (f" ({st['over_1s']}>1s)" if st["over_1s"] else "")


def table_lines(result: dict) -> list[str]:
    """The per-phase table as printed (Markdown, so docs/benchmarks can take it as it is)."""
    head = ["phase", "msg/s", "sent", "jitter p50 / p99 / p99.9 ms", "publish lateness p99.9 ms", "floor p99.9 ms",
            "intake lag max msgs", "broker msgs through / held", "broker RSS MB end / max", "broker CPU",
            "slowest claim s",
            "slowest delete s", "slowest scan s", "dup", ">60 s late", "lost", "notes"]
    rows = [head, ["---"] * len(head)]
    for p in result["phases"]:
        j, f, st = p.get("jitter_ms") or {}, p.get("broker_floor_ms") or {}, p.get("statements") or {}
        pub = p.get("publish_lateness_ms") or {}
        notes = []
        if "spike" in p:
            notes.append(f"drain {p['spike']['drain_s']:.1f} s at {p['spike']['fire_rate']:,.0f}/s")
        if p.get("far_rows"):
            notes.append(f"{p['far_rows']:,} rows in {p['far_fill_s']:.1f} s")
        ev = p.get("event") or {}
        if ev.get("vacuum_s") is not None:
            notes.append(f"VACUUM {ev['vacuum_s']:.1f} s")
        if "autovacuum_seen" in ev:
            seen = f"after {ev['autovacuum_after_s']:.1f} s" if ev['autovacuum_seen'] else "not seen"
            notes.append(f"autovacuum {seen}")
        store = p.get("store") or {}
        if store.get("autovacuums"):
            notes.append(f"{store['autovacuums']} autovacuum(s)")
        if not p.get("targets_met", True):
            notes.append("missed: " + ",".join(k for k, v in p["targets"].items() if not v))
        rate = "all due at once" if "spike" in p else f"{p['rate']:,.0f}"
        b = p.get("broker") or {}
        rows.append([p["name"], rate, f"{p['sent']:,}",
                     f"{_ms(j.get('p50'))} / {_ms(j.get('p99'))} / {_ms(j.get('p999'))}", _ms(pub.get("p999")),
                     _ms(f.get("p999")), _count(b.get("intake_lag_max")),
                     f"{_count(b.get('messages_through'))} / {_count(b.get('messages_held'))}",
                     f"{_count(b.get('rss_mb'))} / {_count(b.get('rss_mb_max'))}",
                     "-" if b.get("cpu_cores") is None else f"{b['cpu_cores']:.2f}",
                     _slowest(st.get("claim")), _slowest(st.get("delete")), _slowest(st.get("scan")),
                     str(p["duplicates"]), str(p["late_over_60s"]), str(p["lost"]), "; ".join(notes)])
    return ["| " + " | ".join(r) + " |" for r in rows]


# ---------------------------------------------------------------------------------------------
# the stack's side: metrics, vacuum


class Scraper:
    """Scrapes every program's /metrics (port = base + role offset + process number, as chronos.telemetry.endpoints)."""

    def __init__(self, base: int | None, programs):
        self.base, self.programs = base, programs

    def scrape(self) -> dict[str, dict] | None:
        from chronos.telemetry.endpoints import ROLE_OFFSETS
        if not self.base:
            return None
        out = {}
        for name in self.programs():
            role, _, num = name.rpartition("_")
            if role not in ROLE_OFFSETS or not num.isdigit():
                continue  # not a Chronos role
            port = self.base + ROLE_OFFSETS[role] + int(num)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    out[name] = parse_metrics(resp.read().decode())
            except OSError as exc:
                print(f"cannot scrape {name} on port {port}: {exc}", flush=True)
        return out


class Event(threading.Thread):
    """What a phase does to the table while its load runs: a manual VACUUM, or bringing on an autovacuum."""

    def __init__(self, kind: str, url: str, delay: float):
        super().__init__(name=f"event-{kind}", daemon=True)
        self.kind, self.url, self.delay = kind, url, delay
        self.done = threading.Event()
        self.figures: dict = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        import psycopg
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                if self.kind == "vacuum":
                    self.vacuum(conn)
                else:
                    self.autovacuum(conn)
        except psycopg.Error as exc:
            self.figures["error"] = str(exc).strip().splitlines()[0]
            print(f"{self.kind}: {self.figures['error']}", flush=True)
        finally:
            self.done.set()

    def vacuum(self, conn) -> None:
        self.stopping.wait(self.delay)
        started = time.monotonic()
        conn.execute(f"VACUUM {TABLE}")
        self.figures["vacuum_s"] = round(time.monotonic() - started, 2)
        print(f"  VACUUM {TABLE}: {self.figures['vacuum_s']:.1f} s", flush=True)

    @staticmethod
    def reloptions(conn) -> dict[str, str]:
        return dict(o.split("=", 1) for o in conn.execute(
            "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = %s::regclass", (TABLE,)).fetchone()[0])

    def autovacuum(self, conn) -> None:
        """Lower the table's autovacuum thresholds (and autovacuum_naptime, when allowed) and wait until
        autovacuum_count grows; the table's and server's settings are restored afterwards."""
        import psycopg
        started = time.monotonic()
        count = lambda: conn.execute("SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = %s",  # noqa: E731
                                     (TABLE,)).fetchone()[0]
        was = count()
        old = self.reloptions(conn)
        conn.execute(f"ALTER TABLE {TABLE} SET ({', '.join(f'{k} = {v}' for k, v in AUTOVACUUM_OPTIONS.items())})")
        naptime = False
        try:
            try:
                conn.execute("ALTER SYSTEM SET autovacuum_naptime = '1s'")
                conn.execute("SELECT pg_reload_conf()")
                naptime = True
            except psycopg.Error as exc:
                print(f"  cannot lower autovacuum_naptime ({str(exc).strip().splitlines()[0]}): "
                      "waiting for the server's own", flush=True)
            while not self.stopping.is_set():
                if count() > was:
                    self.figures.update(autovacuum_seen=True, autovacuum_after_s=round(time.monotonic() - started, 2))
                    print(f"  autovacuum of {TABLE} ran, {self.figures['autovacuum_after_s']:.1f} s into the phase",
                          flush=True)
                    return
                self.stopping.wait(0.25)
            self.figures["autovacuum_seen"] = False
        finally:
            conn.execute(f"ALTER TABLE {TABLE} RESET ({', '.join(AUTOVACUUM_OPTIONS)})")
            kept = {k: v for k, v in old.items() if k in AUTOVACUUM_OPTIONS and NUMBER.match(v)}
            if kept:  # the migration's own values (numbers read back from the catalog)
                conn.execute(f"ALTER TABLE {TABLE} SET ({', '.join(f'{k} = {v}' for k, v in kept.items())})")
            if naptime:
                conn.execute("ALTER SYSTEM RESET autovacuum_naptime")
                conn.execute("SELECT pg_reload_conf()")
            self.figures["settings_restored"] = self.reloptions(conn) == old


# ---------------------------------------------------------------------------------------------
# the run


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.day", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Arguments after `--` are passed to `chronos up` unchanged, except --consumers, "
                                       "--firers and --detectors, which are taken as the benchmark's own.")
    p.add_argument("--scale", type=float, default=1.0, help="every duration and count times this (default 1)")
    p.add_argument("--ready-file", type=Path, help="drive this running stack instead of starting one")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="with --ready-file: the stack's CHRONOS_METRICS_PORT (without it, no statement figures); "
                        "a stack started here gets a free one")
    p.add_argument("--delay", type=parse_delay, default=(2.0, 6.0),
                   help="deadline = send time + uniform(MIN, MAX) s, every phase but the spike (default 2:6)")
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--out", type=Path, help="result file (default benchmarks/results/<date>/day-<layout>.json)")
    p.add_argument("--table", type=Path, metavar="RESULT",
                   help="print the table of a result file written before, and run nothing")
    add_layout(p.add_argument_group("layout of the stack started here; also taken from after `--`"))
    g = p.add_argument_group("measurement (the drain timeout counts from the last phase's last deadline; at 90 s by "
                             "default, a message later than 60 s is still seen)")
    add_measurement(g, drain_timeout=90.0)
    g.add_argument("--phase-drain", type=float, default=30.0,
                   help="a phase without quiet time ends when its messages arrived, or this long after its last "
                        "deadline (default 30); stragglers are still counted for it")
    own, up_args = split_argv(argv)
    args = p.parse_args(own)
    resolve_layout(p, args, up_args)
    if args.scale <= 0:
        p.error(f"--scale must be positive, got {args.scale}")
    return args


class Day:
    """One run: the stack's clients (reader, probe), then each phase's producer, in order."""

    def __init__(self, args: argparse.Namespace, stack, info: dict, metrics_base: int | None):
        self.args, self.stack, self.info = args, stack, info
        self.target = ChronosTarget(args, info)
        self.url = info["database_url"]
        self.plan = phases(args.scale)
        self.tag = uuid.uuid4().hex[:8]
        self.ctx = mp.get_context("spawn")
        self.recs = [Records.create(self.ctx, ph.capacity) for ph in self.plan]
        self.scraper = Scraper(metrics_base, lambda: [p["name"] for p in self.target.programs() or []])
        self.table_stats = TableSampler(self.url, TABLE, interval=0.5)
        self.broker_stats = BrokerSampler(info.get("broker_stats_file"))
        self.stop = self.ctx.Event()
        self.helpers: list = []

    def phase_tag(self, k: int) -> str:
        return f"{self.tag}-{k}"

    def start_clients(self) -> None:
        from chronos.adapters.kafka.admin import create_topics
        ctx, t = self.ctx, self.target
        t.probe_topic = f"chronos-bench-probe-{self.tag}"
        create_topics(self.info["bootstrap_servers"], {t.probe_topic: t.output_partitions()},
                      client_config=self.info.get("kafka_properties"))
        cap = int(6 * 3600 * 1000.0 / self.args.probe_interval_ms)  # six hours of samples
        t.probe_sent, t.probe_lat, t.probe_count = ctx.RawArray("d", cap), ctx.RawArray("d", cap), ctx.RawValue("d", 0)
        ready_r, ready_p = ctx.Event(), ctx.Event()
        reader = ctx.Process(target=kafka_load.run_phases_reader, name="bench-reader",
                             args=(t.reader_conf, self.info["output_topic"],
                                   {self.phase_tag(k): rec for k, rec in enumerate(self.recs)}, ready_r, self.stop))
        probe = ctx.Process(target=kafka_load.run_probe, name="bench-probe",
                            args=({**t.producer_conf, "linger.ms": str(self.args.probe_linger_ms)}, t.reader_conf,
                                  t.probe_topic, self.args.probe_interval_ms / 1000.0, t.probe_sent, t.probe_lat,
                                  t.probe_count, ready_p, self.stop))
        reader.start()
        probe.start()
        self.helpers = [reader, probe]
        wait_ready([(reader, ready_r), (probe, ready_p)])
        self.table_stats.start()
        self.broker_stats.start()

    def check(self) -> None:
        for proc in self.helpers:
            if not proc.is_alive():
                raise StackFailed(f"{proc.name} died (exit code {proc.exitcode})")
        self.stack.check_alive()

    def run(self) -> dict:
        self.start_clients()
        started = time.time()
        done = []
        try:
            for k, ph in enumerate(self.plan):
                done.append(self.run_phase(k, ph))
            self.final_drain()
            undelivered = self.account()
        finally:
            self.stop.set()
            for proc in self.helpers:
                proc.join(15)
                if proc.is_alive():
                    proc.terminate()
            self.table_stats.stopping.set()
            self.broker_stats.stopping.set()
            self.target.drop_probe_topic()
        probe = self.target.probe()
        for k, d in enumerate(done):
            ph = self.plan[k]
            spike_deadline = d.pop("_spike_deadline", None)
            # the floor from the phase's first send: not the probe's own warm-up, nor a bulk write before the load
            floor_from = self.recs[k].get("t_first") or d["window"][0]
            d.update(phase_figures(self.recs[k], window=(floor_from, d["window"][1]), probe=probe,
                                   timing_advance_ms=self.args.timing_advance_ms, spike_deadline=spike_deadline))
            d["store"] = self.table_stats.figures(*d["window"])
            d["broker"] = broker_figures(self.broker_stats.samples, *d["window"], d.get("cpu"))
            d["window_s"] = [round(d["window"][0] - started, 1), round(d["window"][1] - started, 1)]
            d.pop("window")
            d["targets"] = targets(d)
            d["targets_met"] = all(d["targets"].values())
            d["phase"] = asdict(ph)
        sent = probe[0]
        return {"phases": done, "seconds": round(time.time() - started, 1), "undelivered": undelivered,
                "probe": {"samples": int(sent.size),
                          "last_sample_s": round(float(sent.max()) - started, 1) if sent.size else None}}

    def run_phase(self, k: int, ph: Phase) -> dict:
        args, rec = self.args, self.recs[k]
        start = time.time()
        print(f"phase {k + 1}/{len(self.plan)} {ph.name}: {ph.rate:,.0f} msg/s for {ph.duration:g} s"
              + (f", then {ph.quiet:g} s quiet" if ph.quiet else "")
              + (f", all due {ph.spike_ahead:g} s after the start" if ph.spike_ahead else "")
              + (f", after {ph.far_rows:,} far-future rows" if ph.far_rows else "")
              + (f", with {ph.event}" if ph.event else ""), flush=True)
        before = self.scraper.scrape()
        meter = CpuMeter({**self.target.cpu_groups(), **{p.name: (p.pid, False) for p in self.helpers}})
        meter.start(start)
        result: dict = {"name": ph.name, "rate": ph.rate}
        if ph.far_rows:
            print(f"  writing {ph.far_rows:,} far-future rows ...", flush=True)
            result["far_rows"] = ph.far_rows
            result["far_fill_s"] = round(fill_far(self.url, ph.far_rows, prefix=f"far-{self.tag}-",
                                                  payload_bytes=args.payload_bytes, spacing_ms=1000.0, vacuum=False), 2)
            print(f"  ... in {result['far_fill_s']:.1f} s", flush=True)
        t0 = time.time() + 1.5  # the producer process's start
        seed = random.randrange(1 << 30)
        plan = kafka_load.LoadPlan(tag=self.phase_tag(k), rate=ph.rate, count=ph.capacity, t0=t0,
                                   delay_min=args.delay[0], delay_max=args.delay[1],
                                   payload_bytes=args.payload_bytes, seed=seed,
                                   deadline_at=t0 + ph.spike_ahead if ph.spike_ahead else None)
        stop_load = self.ctx.Event()
        producer = self.ctx.Process(target=kafka_load.run_producer, name="bench-producer",
                                    args=(self.target.producer_conf, self.info["input_topic"], plan, rec, stop_load))
        producer.start()
        meter.groups["bench-producer"] = (producer.pid, False)
        event = Event(ph.event, self.url, delay=min(10.0, ph.duration / 4)) if ph.event else None
        if event is not None:
            event.start()
        next_line = time.time() + args.progress
        load_end = None
        try:
            while True:
                time.sleep(0.25)
                now = time.time()
                self.check()
                meter.sample()
                producing = rec.get("producer_done") != 1.0
                if producing and not producer.is_alive():
                    raise StackFailed(f"the load producer died (exit code {producer.exitcode})")
                # an event's load lasts its duration and until the event ended (at most max_duration);
                # any other load is its full count
                if event is not None and now >= t0 + ph.duration and event.done.is_set():
                    stop_load.set()
                if ph.max_duration and now >= t0 + ph.max_duration:
                    stop_load.set()
                    if event is not None:
                        event.stopping.set()
                if not producing and load_end is None:
                    load_end = now
                if now >= next_line:
                    self.progress(k, now - start)
                    next_line = now + args.progress
                if load_end is None:
                    continue
                if ph.quiet is not None:
                    if now >= load_end + ph.quiet:
                        break
                elif self.all_arrived(rec) or now > self.last_deadline(rec) + args.phase_drain:
                    break
        finally:
            stop_load.set()
            if event is not None:
                event.stopping.set()
                event.join(30)
            producer.join(30)
            if producer.is_alive():
                producer.terminate()
        end = time.time()
        after = self.scraper.scrape()
        result["statements"] = statement_figures(before, after) if before is not None and after is not None else None
        result["cpu"] = meter.stop(end)
        result["window"] = (start, end)
        result["duration_s"] = round(end - start, 1)
        if event is not None:
            result["event"] = event.figures
        if ph.spike_ahead:
            result["_spike_deadline"] = plan.deadline_at
        return result

    @staticmethod
    def all_arrived(rec: Records) -> bool:
        n = int(rec.get("sent"))
        return not bool(np.any((rec.state[:n] == ACKED) & np.isnan(rec.delivered_at[:n])))

    @staticmethod
    def last_deadline(rec: Records) -> float:
        n = int(rec.get("sent"))
        return float(np.nanmax(rec.deadline[:n])) if n else 0.0

    def progress(self, k: int, elapsed: float) -> None:
        rec = self.recs[k]
        n = int(rec.get("sent"))
        delivered = int(np.count_nonzero(~np.isnan(rec.delivered_at[:n])))
        overdue = sum(r.overdue(time.time(), 0.5) for r in self.recs[:k + 1])
        live = self.table_stats.live_rows()
        print(f"  [{elapsed:6.1f}s] {self.plan[k].name}: sent {n:>8} delivered {delivered:>8}  "
              f"overdue>0.5s (every phase so far) {overdue:>7}  store ~{live if live is not None else '?'} rows  "
              f"probe samples {int(self.target.probe_count.value)}",
              flush=True)

    def account(self) -> dict:
        """Where every message acknowledged on the input and never seen delivered is, by the end."""
        ids = [i for k, rec in enumerate(self.recs) for i in accounting.undelivered_ids(rec, self.phase_tag(k))]
        accounted = accounting.account_stack(ids, self.info)
        print(accounting.render(accounted), flush=True)
        return accounted

    def final_drain(self) -> None:
        """Wait for every phase's stragglers, up to the drain timeout past the last deadline."""
        last = max((self.last_deadline(r) for r in self.recs), default=0.0)
        print("waiting for the last messages ...", flush=True)
        while not all(self.all_arrived(r) for r in self.recs) and time.time() < last + self.args.drain_timeout:
            self.check()
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.table:
        try:
            print("\n".join(table_lines(orjson.loads(args.table.read_bytes()))))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
            print(f"cannot read the result {args.table}: {exc}", file=sys.stderr)
            return 2
        return 0
    counts = {"consumer": args.consumers, "firer": args.firers, "detector": args.detectors}
    up_args = list(args.up_args)
    metrics_base = args.metrics_port
    if args.ready_file:
        stack: ChronosUp | External = External(args.ready_file)
    else:
        given = argparse.ArgumentParser(add_help=False)
        given.add_argument("--metrics-port", type=int)
        from_up = given.parse_known_args(up_args)[0].metrics_port
        if from_up:
            metrics_base = from_up
        else:
            metrics_base = metrics_base or pick_metrics_base(counts)
            up_args += ["--metrics-port", str(metrics_base)]
        stack = ChronosUp(*layout_args(args.consumers, args.firers, args.detectors), *up_args)

    def run(info: dict) -> tuple[str, str, dict]:
        day = Day(args, stack, info, metrics_base)
        layout = day.target.layout()
        date = report.now_iso()
        return layout, date, day.run()
    code, ran = run_on(stack, run)
    if ran is None:
        return code
    layout, date, result = ran
    result = report.finite({
        "benchmark": "day", "layout": layout, "scale": args.scale, "date": date, **result,
        "targets_met": all(p["targets_met"] for p in result["phases"]),
        "config": {"delay": f"{args.delay[0]:g}:{args.delay[1]:g}", "payload_bytes": args.payload_bytes,
                   "fetch_wait_ms": args.fetch_wait_ms, "linger_ms": args.linger_ms,
                   "probe_interval_ms": args.probe_interval_ms, "chronos_up_args": up_args, "argv": sys.argv[1:]},
        "machine": report.machine_info(), "code": report.code_version()})
    print(f"\nday in the life, layout {layout}, scale {args.scale:g}:")
    print("\n".join(table_lines(result)), flush=True)
    out = args.out or Path("benchmarks/results") / datetime.now(timezone.utc).strftime("%Y-%m-%d") / \
        f"day-{layout.replace('/', 'x')}{'' if args.scale == 1 else f'-scale{args.scale:g}'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(f"wrote {out}", flush=True)
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
