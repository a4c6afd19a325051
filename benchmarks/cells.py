"""`python -m benchmarks.cells`: an input partition moved between the cells of one stack under a steady load, with
a million far-future rows in it (`chronos cells move`, docs/operations/scaling.md).

    python -m benchmarks.cells                                  # 1,000 msg/s, 1,000,000 far-future rows
    python -m benchmarks.cells --rate 500 --far 100000 --out benchmarks/out/cells.json
    python -m benchmarks.cells --move-rate 0                    # the move unpaced (CHRONOS_MOVE_RATE)
    python -m benchmarks.cells --control 56                     # no move: the same 56 s of the same run's age
    python -m benchmarks.cells --aged 3000000                   # each cell's table through 3 M messages first

Starts `chronos up --cells 2` (the input partitions 0-3 in cell1, 4-7 in cell2), writes `--far` rows due in a
year into `--partition` of cell1 through the consumer's own COPY path, then runs the load (`kits.traffic.Load`:
deadlines 0.5-5 s ahead; each message's Kafka key picks its partition) and reads the
output topic. After `--before` seconds it moves the partition to cell2, and goes on `--after` seconds once the
move ended. Reported: messages sent, lost, duplicated and published early (before their deadline less the timing
advance); the moved partition's lateness (read time - when it was due) of the messages due from the move's start
to its end plus 10 s, at most and p99.9; the other partitions' p99.9 over the same window beside the window of
the same length before the move (jitter, read time - deadline; and the publish's own, CreateTime - deadline);
the move's own figures (its rows copied, its cut-over, its length, its pace, each line it said with when), and the
machine's load average (over one minute) when the move began and when it ended; and, for each 10 s from the
window before the move to its end, the other partitions' jitter and publish lateness at p99.9 and most, so that a
stall shows when it came; and for the same 10 s, what each cell's sessions wait on (each role's, the move's among
the others, autovacuum's), with the checkpoints and the WAL of those seconds, and the cores each kind of process on
the machine used (each cell's PostgreSQL by backends, autovacuum and the rest; the broker; each Chronos role; the
move), so that a stall shows what it was; and the harness's own garbage collections of 5 ms or more, when (its
reader's read times would wait for them: it runs with the collector off).

With `--aged N`, each cell's table has first carried N messages as a queue 100,000 deep would
(`benchmarks.harness.database.age_table`: written through the consumer's COPY path and deleted as the firers'
claims delete, into a partition that is not moved), so that the move walks a table of a long-lived stack: its
size, its indexes' bloat and its free space scattered; the tables' sizes are reported.

A control run (`--control SECONDS`) does everything the same but the move: the window it reports is the same
SECONDS from the same point of the run, so the other partitions' figures over it are those of a stack of the same
age without a move. The embedded broker slows as it holds more batches, so a run's later seconds are slower than
its earlier ones with or without a move: "unchanged" is the move's window against a control's, run in turn.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from benchmarks.harness.database import DAY_S, age_table, fill_far, table_mb
from benchmarks.harness.procstat import MachineCpu
from benchmarks.harness.report import service_root
from kits.stack import CHRONOS, ChronosUp, clean_env, layout_args
from kits.traffic import Load, Reader

TIMING_ADVANCE_S = 0.05
# The embedded broker lists every batch a partition holds at each fetch (docs/explanations/embedded-broker.md,
# "Why it slows"): with the load's batches of 5 ms and a reader fetching every 10 ms it used more than a core of
# this 2-core machine after two minutes at 1,000 msg/s, against 0.4 with 50 ms each, and the stack's processes
# and the reader slowed with it. With fewer, larger batches and fetches the machine's load stays the stack's own;
# the reader's read times trail by up to its fetch wait.
LOAD_LINGER_MS = 50
#: The partition of each cell whose rows age its table (`--aged`): one that is not moved.
AGED_PARTITION = {"cell1": 0, "cell2": 4}
READER_FETCH_WAIT_MS = 50


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of `values`; None of none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100.0 * len(ordered) + 0.5)) - 1))]


def figures(values: list[float]) -> dict[str, Any]:
    return {"messages": len(values), "p50_s": _r(percentile(values, 50)), "p99_s": _r(percentile(values, 99)),
            "p99_9_s": _r(percentile(values, 99.9)), "max_s": _r(max(values) if values else None)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cells", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="messages per second (default 1,000)")
    p.add_argument("--far", type=int, default=1_000_000, help="far-future rows in the moved partition")
    p.add_argument("--partition", type=int, default=3, help="the partition moved from cell1 to cell2 (default 3)")
    p.add_argument("--before", type=float, default=60.0, help="seconds of load before the move")
    p.add_argument("--after", type=float, default=30.0, help="seconds of load after the move ended")
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--firers", type=int, default=1, help="per cell")
    p.add_argument("--detectors", type=int, default=1, help="per cell")
    p.add_argument("--move-rate", type=int, default=None,
                   help="rows a second the move goes at (CHRONOS_MOVE_RATE; default: chronos's own)")
    p.add_argument("--load-linger-ms", type=int, default=LOAD_LINGER_MS,
                   help=f"the load's producer linger (default {LOAD_LINGER_MS})")
    p.add_argument("--reader-fetch-wait-ms", type=int, default=READER_FETCH_WAIT_MS,
                   help=f"the output topic's reader's fetch wait (default {READER_FETCH_WAIT_MS})")
    p.add_argument("--aged", type=int, default=0, metavar="N",
                   help="messages each cell's table carries before the far-future rows are written (default 0)")
    p.add_argument("--control", type=float, default=None, metavar="SECONDS",
                   help="run no move: report the window of SECONDS where the move would have begun (a control)")
    p.add_argument("--collect-garbage", action="store_true",
                   help="let the harness collect its garbage while it measures, as Python does by default")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out/cells.json"))
    args = p.parse_args(argv)

    stack = ChronosUp("--cells", "2", *layout_args(args.consumers, args.firers, args.detectors))
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {_cores()} cores",
                              "rate": args.rate, "far": args.far, "partition": args.partition,
                              "before_s": args.before, "after_s": args.after,
                              "move_rate": args.move_rate, "load_linger_ms": args.load_linger_ms,
                              "reader_fetch_wait_ms": args.reader_fetch_wait_ms,
                              "layout": {"consumers": args.consumers, "firers_per_cell": args.firers,
                                         "detectors_per_cell": args.detectors},
                              "aged": args.aged, "control_s": args.control,
                              "collect_garbage": args.collect_garbage, "code": _commit()}
    load = reader = None
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    # the reader turns the collector off while it measures, unless --collect-garbage (kits.traffic.CollectorOff)
    try:
        info = stack.start(timeout=300)
        cells = info["cells"]
        if args.aged:
            result["aged_s"] = {}
            for cell, url in cells.items():
                print(f"putting {args.aged:,} messages through {cell}'s table ...", flush=True)
                result["aged_s"][cell] = round(age_table(url, args.aged, partition=AGED_PARTITION[cell],
                                                         progress=True), 1)
        print(f"writing {args.far:,} far-future rows into partition {args.partition} of cell1 ...", flush=True)
        result["far_fill_s"] = round(fill_far(cells["cell1"], args.far, ahead_s=365 * DAY_S, partition=args.partition,
                                              progress=True), 1)
        result["table_mb"] = {cell: table_mb(url) for cell, url in cells.items()}
        reader = Reader(info["bootstrap_servers"], info["output_topic"], fetch_wait_ms=args.reader_fetch_wait_ms,
                        collect_garbage=args.collect_garbage)
        reader.start()
        reader.wait_assigned()
        load = Load(info["bootstrap_servers"], info["input_topic"], rate=args.rate, late=0.0, seed=11,
                    linger_ms=args.load_linger_ms)
        load.start()
        print(f"load at {args.rate:,.0f} msg/s for {args.before:.0f}s before the move ...", flush=True)
        time.sleep(max(0.0, args.before - 20.0))
        waits = Waits(cells)
        waits.start()
        machine = MachineCpu()
        machine.start()
        time.sleep(min(20.0, args.before))
        load_at = [os.getloadavg()[0]]
        moved_from = time.time()
        if args.control is None:
            result["move_said"], result["move"] = _move(args, stack, moved_from)
        else:
            time.sleep(args.control)
            result["move_said"], result["move"] = [], None
        moved_until = time.time()
        load_at.append(os.getloadavg()[0])
        result["load_average_1m"] = {"move_began": round(load_at[0], 2), "move_ended": round(load_at[1], 2)}
        time.sleep(args.after)
        waits.stopping.set()
        machine.stopping.set()
        waits.join(10)
        machine.join(10)
        result["waits_by_10s"] = waits.by_10s(moved_from)
        result["cpu_by_10s"] = machine.by_10s(moved_from)
        result["harness_gc_pauses"] = pauses.since(moved_from)
        load.stop()
        sent = dict(load.sent)
        missing = reader.missing(sent, 120)
    finally:
        gc.callbacks.remove(pauses)
        if load is not None and load.is_alive():
            load.stop()
        if reader is not None:
            reader.stop()
        stack.stop()
    window = (moved_from, moved_until + 10.0)
    before = (moved_from - (window[1] - window[0]), moved_from)
    moved = [m for m, s in sent.items() if s.partition == args.partition]
    others = [m for m, s in sent.items() if s.partition != args.partition]

    def within(ids: list[str], span: tuple[float, float]) -> list[str]:
        return [m for m in ids if span[0] <= sent[m].due < span[1] and m in reader.arrivals]
    result["messages"] = {
        "sent": len(sent), "lost": len(missing), "found_on_reread": len(reader.found_on_reread),
        "duplicated": sum(1 for m in sent if len(reader.arrivals.get(m, [])) > 1),
        "early": sum(1 for m, s in sent.items()
                     if m in reader.created and reader.created[m] < s.deadline - TIMING_ADVANCE_S - 0.001),
    }
    result["moved_partition_during_move"] = figures([reader.arrivals[m][0] - sent[m].due for m in within(moved, window)])
    result["others_during_move"] = {
        "jitter": figures([reader.arrivals[m][0] - sent[m].deadline for m in within(others, window)]),
        "publish_lateness": figures([reader.created[m] - sent[m].deadline for m in within(others, window)])}
    result["others_before_move"] = {
        "jitter": figures([reader.arrivals[m][0] - sent[m].deadline for m in within(others, before)]),
        "publish_lateness": figures([reader.created[m] - sent[m].deadline for m in within(others, before)])}
    result["others_by_10s"] = timeline(others, sent, reader, before[0], window[1], moved_from)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps({k: v for k, v in result.items() if k != "layout"}, option=orjson.OPT_INDENT_2).decode())
    print(f"written to {args.out}")
    return 0 if not missing and result["messages"]["early"] == 0 else 1


# the checkpoints begun (PostgreSQL 17 on; pg_stat_bgwriter's before) and the WAL written so far
CHECKPOINTS = """SELECT (SELECT num_timed + num_requested FROM pg_stat_checkpointer),
                        (SELECT wal_bytes::bigint FROM pg_stat_wal)"""


class Waits(threading.Thread):
    """What each cell's PostgreSQL sessions wait on, sampled every `every` s: per sample, each role's sessions
    in a statement (`pg_stat_activity`, by application name: chronos ROLE NODE; autovacuum's workers as
    `autovacuum`; anything else is `other`, the move's own sessions among them) by wait event (`CPU` when
    waiting on none), and the cell's checkpoints and WAL written so far."""

    def __init__(self, urls: dict[str, str], every: float = 0.5):
        super().__init__(name="waits", daemon=True)
        self.urls, self.every = urls, every
        self.samples: list[tuple[float, str, dict[str, int], tuple[int, int]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        import psycopg
        conns = {cell: psycopg.connect(url, autocommit=True) for cell, url in self.urls.items()}
        try:
            while not self.stopping.wait(self.every):
                for cell, conn in conns.items():
                    try:
                        rows = conn.execute(
                            "SELECT CASE WHEN backend_type = 'autovacuum worker' THEN 'autovacuum' "
                            "WHEN application_name LIKE 'chronos %%' "
                            "THEN split_part(application_name, ' ', 2) ELSE 'other' END, "
                            "coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity "
                            "WHERE state = 'active' AND pid <> pg_backend_pid() "
                            "AND backend_type IN ('client backend', 'autovacuum worker')"
                        ).fetchall()
                        ckpt = conn.execute(CHECKPOINTS).fetchone()
                    except psycopg.Error:
                        continue
                    counts: dict[str, int] = {}
                    for role, wait in rows:
                        counts[f"{role} {wait}"] = counts.get(f"{role} {wait}", 0) + 1
                    self.samples.append((time.time(), cell, counts, (int(ckpt[0]), int(ckpt[1]))))
        finally:
            for conn in conns.values():
                conn.close()

    def by_10s(self, zero: float) -> list[dict[str, Any]]:
        """Per 10 s from `zero` and cell: the samples, each role's mean sessions in a statement by wait event
        (the five most), the checkpoints begun and the WAL written (MB) in those 10 s."""
        groups: dict[tuple[int, str], list] = {}
        for at, cell, counts, ckpt in self.samples:
            groups.setdefault((int((at - zero) // 10), cell), []).append((counts, ckpt))
        rows = []
        for (b, cell), items in sorted(groups.items()):
            total: dict[str, int] = {}
            for counts, _ in items:
                for k, n in counts.items():
                    total[k] = total.get(k, 0) + n
            top = sorted(total.items(), key=lambda kv: -kv[1])[:5]
            rows.append({"from_s": b * 10, "cell": cell, "samples": len(items),
                         "waits": {k: round(n / len(items), 2) for k, n in top},
                         "checkpoints": items[-1][1][0] - items[0][1][0],
                         "wal_mb": round((items[-1][1][1] - items[0][1][1]) / 1e6, 1)})
        return rows


class GcPauses:
    """The harness's own garbage collections (its reader's read times wait for them), timed by gc.callbacks:
    each one of `at_least_s` or more, when it began and how long it took."""

    def __init__(self, at_least_s: float = 0.005, clock: Callable[[], float] = time.time):
        self.at_least_s, self.clock = at_least_s, clock
        self.pauses: list[tuple[float, int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = self.clock()
        if phase == "start":
            self._began = now
        elif now - self._began >= self.at_least_s:
            self.pauses.append((self._began, info["generation"], now - self._began))

    def since(self, zero: float) -> list[dict[str, Any]]:
        return [{"at_s": round(at - zero, 1), "generation": g, "ms": round(took * 1000, 1)}
                for at, g, took in self.pauses]


def timeline(ids: list[str], sent: dict[str, Any], reader: Reader, start: float, end: float,
             zero: float) -> list[dict[str, Any]]:
    """The messages of `ids` due from `start` to `end`, by 10 s of their due time (seconds from `zero`): how many,
    their jitter and publish lateness at p99.9 and most."""
    buckets: dict[int, list[str]] = {}
    for m in ids:
        if start <= sent[m].due < end and m in reader.arrivals:
            buckets.setdefault(int((sent[m].due - zero) // 10), []).append(m)
    rows = []
    for b in sorted(buckets):
        jitter = [reader.arrivals[m][0] - sent[m].deadline for m in buckets[b]]
        lateness = [reader.created[m] - sent[m].deadline for m in buckets[b] if m in reader.created]
        rows.append({"from_s": b * 10, "messages": len(jitter), "jitter_p99_9_s": _r(percentile(jitter, 99.9)),
                     "jitter_max_s": _r(max(jitter)), "publish_p99_9_s": _r(percentile(lateness, 99.9)),
                     "publish_max_s": _r(max(lateness) if lateness else None)})
    return rows


def _move(args: argparse.Namespace, stack: ChronosUp, moved_from: float) -> tuple[list, dict[str, Any]]:
    """`chronos cells move` run as the stack runs its processes, its lines printed as they come: what it said,
    each line with its second from `moved_from`, and its figures."""
    paced = [] if args.move_rate is None else ["--move-rate", str(args.move_rate)]
    moving = subprocess.Popen(CHRONOS + ["cells", "move", "--partition", str(args.partition), "--to", "cell2",
                                         "--ready-file", str(stack.ready_file), *paced],
                              env=clean_env(), cwd=stack.workdir,  # as the stack: PYTHONPATH's code, if any
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    assert moving.stdout is not None
    for line in moving.stdout:
        said.append((round(time.time() - moved_from, 1), line.rstrip()))
        print(line, end="", flush=True)
    returncode = moving.wait(60)
    output = "\n".join(line for _, line in said)
    if returncode != 0:
        raise SystemExit(f"the move failed (exit {returncode}): {output}")
    return said, move_figures(output, time.time() - moved_from)


def move_figures(output: str, took_s: float) -> dict[str, Any]:
    """What `chronos cells move` said of itself: rows copied ahead and carried, the cut-over's length, rows
    handed over and woken."""
    def number(pattern: str) -> float | None:
        found = re.search(pattern, output)
        return float(found.group(1).replace(",", "")) if found else None
    return {"took_s": round(took_s, 2), "copied_ahead": number(r"([\d,]+) rows copied ahead,"),
            "changes_carried": number(r"([\d,]+) changes carried over"),
            "cut_over_s": number(r"cut over to cell \S+ at epoch \d+ in ([\d.]+)s"),
            "handed_over": number(r"\(([\d,]+) rows handed over"), "woken": number(r"([\d,]+) rows woken there")}


def _cores() -> int:
    return os.cpu_count() or 0


def _commit() -> str | None:
    """The commit of the code that runs the stack and the move: this checkout's, or the one `PYTHONPATH` names."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=service_root(), capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


if __name__ == "__main__":
    raise SystemExit(main())
