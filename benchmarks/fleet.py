"""Network partitions under load on a fleet of hosts on this machine: two Chronos hosts installed from the
wheel built from this checkout (as docs/operations/host-install.md says), a replicated PostgreSQL (Patroni,
synchronous replication) and the broker, each host a network namespace, partitions as nftables rules that
drop packets silently (kits/fleet).

    python -m benchmarks.fleet --out benchmarks/results/DATE/fleet.json          # every scenario, both layouts
    python -m benchmarks.fleet --scenarios host,kafka --cut 30 --layouts 1

Scenarios, each on the same fleet, whole again (no cut, a leader and a synchronous standby, every host
running) before the next one starts:

- `primary`      a) the PostgreSQL primary's host cut off from everything;
- `host`         b) a Chronos host cut off from everything;
- `host-db`      c) a Chronos host cut off from PostgreSQL only (Kafka reachable);
- `host-kafka`   d) a Chronos host cut off from Kafka only (PostgreSQL reachable);
- `kafka`        e) the Kafka host cut off from everything;
- `primary-out`  f) one-way loss: the primary's host's packets dropped on the way out, delivered on the way in;
- `upgrade`      g) a rolling upgrade from the previous release (built from its commit, CHANGELOG.md) and a
                 rollback, with the upgrade page's blocks, `--settle` seconds between steps, on a fleet of
                 its own that starts on the previous release.

Layouts: `1` is one process of every role on each of the two hosts, `2` two of every role on each. Per
scenario: messages sent (acknowledged by the broker), lost, early, duplicated (explained by the fault,
landed after the heal from a publish in flight at the cut, fired again after the heal because the cut lost
the acknowledgement of a publish just before it, republished after the heal), the longest
pause in deliveries and when it ended (after the fault, the heal, the promotion), the latest delivery
after its due time, and what operators saw: each program's /healthz as a monitoring host and as the
host itself saw it, the first log line of each kind, `chronos status` from a host on the right side.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path

import orjson

from kits.fleet import Fleet, build_wheel, install_chronos, previous_release, release_wheel, require_fleet_tools
from kits.fleet.scenarios import RUNNERS, SCENARIOS, rolling_upgrade

ALL = (*SCENARIOS, "upgrade")

LAYOUTS = {"1": (1, 1, 1), "2": (2, 2, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(ALL), help="comma-separated, of: " + ", ".join(ALL))
    parser.add_argument("--layouts", default="1,2", help="comma-separated: 1 (one of every role per host), 2 (two)")
    parser.add_argument("--rate", type=float, default=300.0, help="messages per second (default 300)")
    parser.add_argument("--cut", type=float, default=60.0, help="seconds each cut lasts (default 60)")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds of load between the upgrade's steps (default 20)")
    parser.add_argument("--members", type=int, default=2, choices=(2, 3),
                        help="PostgreSQL members: 2 with etcd on a host of its own, 3 with etcd on each (default 2)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this directory and keep it (every host's logs, each scenario's raw "
                             "deliveries); by default a temporary one, removed at the end")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    layouts = [n.strip() for n in args.layouts.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL)) + sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        parser.error(f"unknown scenarios or layouts: {', '.join(unknown)}")
    require_fleet_tools()
    # a SIGTERM ends the run as Ctrl-C does: the fleet is closed, nothing of it left running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = []
    with (contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="chronos-fleet-")) as tmp:
        work = Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print("building the wheel and installing it as the install page says ...", flush=True)
        opt = work / "opt"
        install_chronos(build_wheel(work / "wheel"), opt, work)
        cuts = [n for n in names if n != "upgrade"]
        if "upgrade" in names:
            print(f"building release {previous_release()} from its commit and installing it beside ...", flush=True)
            install_chronos(release_wheel(previous_release(), work / "previous"), opt, work / "previous")
        for layout in layouts:
            if "upgrade" in names:
                fleet = Fleet(work / f"fleet-upgrade-{layout}", opt, per_host=LAYOUTS[layout], members=args.members,
                              release=previous_release())
                print(f"starting the fleet on release {previous_release()}, layout {layout} ...", flush=True)
                fleet.start()
                try:
                    report, row = rolling_upgrade(fleet, rate=args.rate, settle=args.settle)
                    row.update(scenario_key="upgrade", layout="{}/{}/{} per host".format(*LAYOUTS[layout]),
                               carried_before=0, settle_s=args.settle)
                    rows.append(row)
                    print(report.line(), f"longest pause {row['longest_pause_s']} s", flush=True)
                finally:
                    stuck = fleet.close()
                    if stuck:
                        print(f"processes of the fleet outlive its close: {stuck}", file=sys.stderr)
            if not cuts:
                continue
            fleet = Fleet(work / f"fleet-{layout}", opt, per_host=LAYOUTS[layout], members=args.members)
            print(f"starting the fleet, layout {layout} ...", flush=True)
            fleet.start()
            carried = 0
            try:
                for name in cuts:
                    fleet.heal_everything()
                    print(f"scenario {name} (layout {layout}) ...", flush=True)
                    report, row = RUNNERS[name](fleet, cut_s=args.cut, rate=args.rate)
                    row.update(scenario_key=name, layout="{}/{}/{} per host".format(*LAYOUTS[layout]),
                               carried_before=carried)
                    carried += row["sent"]
                    rows.append(row)
                    print(report.line(), flush=True)
            finally:
                stuck = fleet.close()
                if stuck:
                    print(f"processes of the fleet outlive its close: {stuck}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps({
            "date": time.strftime("%Y-%m-%d"), "rate": args.rate, "cut_s": args.cut, "members": args.members,
            "hosts": "2 Chronos hosts, PostgreSQL on 2 (Patroni, synchronous) with etcd on a third, the broker on one",
            "command": "python -m benchmarks.fleet " + " ".join(argv if argv is not None else sys.argv[1:]),
            "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0 if all(r["lost"] == 0 and r["early"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
