"""`chronos up`: the whole stack in the foreground, its flags (chronos/up/command.py runs it)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from chronos import config
from chronos.up import EMBEDDED_PARTITIONS, EXTERNAL_PARTITIONS, PARTITIONS_PER_CELL, ROLES


def add_parser(sub: Any) -> None:
    p = sub.add_parser("up", help="run the whole stack in the foreground (embedded PostgreSQL and broker "
                                  "unless real ones are configured)")
    # --cells is either a count of embedded cells or the list CHRONOS_CELLS takes; a firer's cell is not `up`'s
    config.add_arguments(p, only=tuple(o.attr for o in config.OPTIONS if o.attr not in ("cells", "cell")))
    p.add_argument("--data-dir", default=os.environ.get("CHRONOS_DATA_DIR", ".chronos"),
                   help="where the embedded PostgreSQL keeps its data, and logs go [env CHRONOS_DATA_DIR] "
                        "(default: .chronos)")
    p.add_argument("--bootstrap-servers", dest="kafka_bootstrap_servers_alias", default=None,
                   help="same as --kafka-bootstrap-servers")
    for role in ROLES:
        p.add_argument(f"--{role}s", type=int, default=1, dest=f"n_{role}",
                       help=f"number of {role} processes (default 1)")
    p.add_argument("--partitions", type=int, default=None,
                   help=f"partitions of the topics it creates (default {EMBEDDED_PARTITIONS} on the embedded broker, "
                        f"whose fetches slow with every batch a partition holds; {EXTERNAL_PARTITIONS} on a real Kafka)")
    p.add_argument("--cells", default=None, dest="n_cells", metavar="N|CELLS",
                   help="run N cells, each an embedded PostgreSQL with its firers and detectors (--firers and "
                        "--detectors per cell) and its share of the input partitions; the consumers write each "
                        "message to its partition's cell (default 1: one database, no cells). Or the cells of "
                        "PostgreSQL servers of your own, NAME=URL pairs as CHRONOS_CELLS takes them (that variable "
                        "too), as --database-url names one. The input topic gets "
                        f"{PARTITIONS_PER_CELL} partitions per cell unless --partitions says")
    p.add_argument("--pg-port", type=int, default=None, help="port of the embedded PostgreSQL (default: free; with "
                   "cells, the first cell's, the next ones following it)")
    p.add_argument("--kafka-port", type=int, default=None, help="port of the embedded broker (default: free)")
    p.add_argument("--broker-memory-warning-mb", metavar="MB",
                   default=os.environ.get("CHRONOS_BROKER_MEMORY_WARNING_MB"),
                   help="warn when the embedded broker's memory passes this many MB "
                        "[env CHRONOS_BROKER_MEMORY_WARNING_MB] (default: 2048, or half the machine's "
                        "memory when that is less)")
    p.add_argument("--no-console", action="store_true",
                   help="do not start the web console (it serves on CHRONOS_CONSOLE_HOST:CHRONOS_CONSOLE_PORT)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronos import embedded
    from chronos.up import command
    # before anything starts: the servers it would embed come with the embedded extra
    cells = args.n_cells or os.environ.get("CHRONOS_CELLS")
    given = {"PostgreSQL": args.database_url or os.environ.get("CHRONOS_DATABASE_URL")
             or (cells if cells and not cells.strip().isdigit() else None),
             "broker": args.kafka_bootstrap_servers or args.kafka_bootstrap_servers_alias
             or os.environ.get("CHRONOS_KAFKA_BOOTSTRAP_SERVERS")}
    embedded.require_extra(*(server for server, url in given.items() if not url))
    return command.run(args)
