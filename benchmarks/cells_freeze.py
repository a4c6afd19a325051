"""One cell's PostgreSQL frozen under load, the other cell's messages on time: `chronos up --cells 2` with two
processes of every role (two consumers for both cells, two firers and two detectors of each cell), a steady
load, and cell2's PostgreSQL frozen (SIGSTOP of its postmaster and every backend) for `--freeze` seconds.

    python -m benchmarks.cells_freeze                                  # 1,000 msg/s, a 25 s freeze
    python -m benchmarks.cells_freeze --rate 1000 --freeze 25 --out cells-freeze.json

In one run: `--warmup` seconds of load, then a fault-free window of `--window` seconds, then the freeze, then
`--after` seconds of load once cell2 is thawed, and the drain. Each message's cell is its input partition's (the
map `chronos up` assigns: the first half of the partitions cell1's). The figures:

- cell1's messages (the cell that stays well): the jitter (delivery - due) of those due within the fault-free
  window, and of those due while cell2 is frozen; the goal is the second's p99.9 within 10 % of the first's;
- cell2's: how late its messages due during the freeze were delivered (they wait for it to thaw);
- every message: sent (acknowledged by the broker), lost, early, duplicated;
- the consumers' view: how long after the freeze began each gave up cell2's part of a poll (its
  `has not answered within` line, the cell's patience; before that a poll waited for the statement's deadline)
  and paused its partitions, and when it read them again after the thaw.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.report import code_version
from chronos.domain.cells import assign
from kits.faults import Scenario
from kits.figures import percentiles
from kits.stack import layout_args

CELLS = ("cell1", "cell2")
FROZEN = "cell2"
PARTITIONS = 8  # four per cell, as `chronos up --cells 2` gives by default
GOAL = 1.10     # the frozen window's p99.9 at most this many times the fault-free window's


def backends(postmaster: int) -> list[int]:
    """The postmaster's children (its backends and auxiliary processes), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended since the listing
        if int(fields[1]) == postmaster:
            found.append(int(entry.name))
    return found


def freeze(postmaster: int) -> list[int]:
    """SIGSTOP the postmaster first (it forks no new backend), then every one of its children: the pids."""
    os.kill(postmaster, signal.SIGSTOP)
    children = backends(postmaster)
    for pid in children:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            continue
    return [postmaster, *children]


def thaw(pids: list[int]) -> None:
    """SIGCONT every frozen process, the children first."""
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            continue


def jitter(sc: Scenario, cell_of: dict[int, str], cell: str, due_from: float, due_to: float,
           ahead_only: bool = False) -> dict[str, Any] | None:
    """Percentiles (ms) of delivery - due of `cell`'s messages due in [due_from, due_to) (with `ahead_only`,
    only those sent ahead of their deadline)."""
    assert sc.load is not None and sc.reader is not None
    late = [(min(sc.reader.arrivals[m]) - s.due) * 1000.0 for m, s in sc.load.sent.items()
            if m in sc.reader.arrivals and cell_of.get(s.partition) == cell and due_from <= s.due < due_to
            and (not ahead_only or s.deadline > s.produced)]
    return percentiles(late)


def consumer_log_times(log_dir: Path, since: float) -> dict[str, list[float]]:
    """Seconds after `since` of each consumer's lines about cell2: given up (patience), paused, answering again."""
    signs = {"gave_up": f"cell {FROZEN} has not answered within", "paused": f"cell {FROZEN} does not answer",
             "answers_again": f"cell {FROZEN} answers again"}
    found: dict[str, list[float]] = {k: [] for k in signs}
    for path in sorted(log_dir.glob("consumer_*.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?", line)
            if match is None:
                continue
            at = time.mktime(time.strptime(match[1], "%Y-%m-%dT%H:%M:%S")) - time.timezone + float(match[2] or 0)
            for key, sign in signs.items():
                if sign in line and at >= since:
                    found[key].append(round(at - since, 2))
    return found


def run(workdir: Path, rate: float, warmup: float, window: float, frozen_s: float, after: float) -> dict[str, Any]:
    cell_of = {p: cell for cell, share in assign(list(CELLS), PARTITIONS).items() for p in share}
    with Scenario("cells freeze", workdir, "--cells", "2", *layout_args(2, 2, 2), rate=rate, hold_s=5.0,
                  partitions=PARTITIONS) as sc:
        postmaster = sc.info["cell_postgres_pids"][FROZEN]
        time.sleep(warmup)
        calm_from = time.time()
        time.sleep(window)
        fault_at = time.time()
        pids = freeze(postmaster)
        time.sleep(frozen_s)
        thawed_at = time.time()
        thaw(pids)
        sc.fault(f"{FROZEN}'s PostgreSQL frozen {frozen_s:.0f} s", fault_at, end=thawed_at)
        time.sleep(after)
        report = sc.finish(window_explains=True)
        calm = jitter(sc, cell_of, "cell1", calm_from, fault_at)
        during = jitter(sc, cell_of, "cell1", fault_at, thawed_at)
        ratio = round(during["p999"] / calm["p999"], 3) if calm and during and calm["p999"] > 0 else None
        row = report.row()
        row.update({
            "frozen_s": round(thawed_at - fault_at, 1),
            "frozen_processes": len(pids),
            "cell1_fault_free_ms": calm,
            "cell1_during_freeze_ms": during,
            "cell1_p999_ratio": ratio,
            "goal_met": ratio is not None and ratio <= GOAL and row["lost"] == 0 and row["early"] == 0,
            "cell1_fault_free_sent_ahead_ms": jitter(sc, cell_of, "cell1", calm_from, fault_at, ahead_only=True),
            "cell1_during_freeze_sent_ahead_ms": jitter(sc, cell_of, "cell1", fault_at, thawed_at, ahead_only=True),
            "cell2_during_freeze_ms": jitter(sc, cell_of, FROZEN, fault_at, thawed_at),
            "consumers_after_freeze_s": consumer_log_times(sc.stack.log_dir, fault_at),
        })
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second (default 1000)")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of load before the windows (default 20)")
    parser.add_argument("--window", type=float, default=25.0, help="seconds of the fault-free window (default 25)")
    parser.add_argument("--freeze", type=float, default=25.0, help="seconds cell2 stays frozen (default 25)")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of load after the thaw (default 20)")
    parser.add_argument("--out", type=Path, default=None, help="write the row as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chronos-cells-freeze-") as tmp:
        row = run(Path(tmp), args.rate, args.warmup, args.window, args.freeze, args.after)
    print(orjson.dumps(row, option=orjson.OPT_INDENT_2).decode(), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps({
            "date": time.strftime("%Y-%m-%d"), "code": code_version(), "rate": args.rate, "cells": len(CELLS),
            "layout": "2 consumers, 2 firers and 2 detectors per cell", "partitions": PARTITIONS, "goal_ratio": GOAL,
            "command": "python -m benchmarks.cells_freeze " + " ".join(argv if argv is not None else sys.argv[1:]),
            "row": row}, option=orjson.OPT_INDENT_2))
    return 0 if row["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
