"""`chronos targets`: print this host's Prometheus targets (file-based discovery) from its process counts
and metrics port (chronos/ops/targets.py works them out)."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from chronos import config
from chronos.errors import ConfigError
from chronos.ops.targets import COUNTS, counts_of, groups, render
from chronos.telemetry.endpoints import WILDCARDS


def add_parser(sub: Any) -> None:
    p = sub.add_parser("targets", help="print this host's Prometheus targets (file-based discovery) from its "
                                       "process counts and metrics port",
                       description="Print the Prometheus file-based discovery targets of this host's programs: one "
                                   "group per role it runs (CHRONOS_CONSUMERS, CHRONOS_FIRERS, CHRONOS_DETECTORS, as "
                                   "supervisord.conf reads them), each program at CHRONOS_METRICS_PORT + its role's "
                                   "offset + its number, on CHRONOS_METRICS_ADDRESS (the host's name where that is "
                                   "every interface). Save it as the host's file in the directory the scrape "
                                   "configuration's file_sd_configs read (monitoring/chronos-targets/).")
    config.add_arguments(p, only=("metrics_port", "metrics_address"))
    for role, env in COUNTS.items():
        p.add_argument(f"--{role}s", dest=f"{role}s", type=int, default=None, metavar="N",
                       help=f"{role} programs on the host [env {env}]")
    p.add_argument("--address", default=None,
                   help="the host's name or address as Prometheus reaches it (default: CHRONOS_METRICS_ADDRESS, "
                        "or the host's fully qualified name where that is every interface)")
    p.add_argument("--host", default=None, help="the value of the targets' host label (default: the address)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = config.load(args, default_ready_file=False)
    if not settings.metrics_port:
        raise ConfigError("CHRONOS_METRICS_PORT is not set: the programs serve no /metrics to scrape")
    counts = counts_of(args, os.environ)
    address = args.address or (socket.getfqdn() if settings.metrics_address in WILDCARDS
                               else settings.metrics_address)
    found = groups(address, settings.metrics_port, counts, host=args.host)
    layout = ", ".join(f"{counts[role]} {role}{'s' if counts[role] != 1 else ''}" for role in COUNTS)
    print(render(found, f"Host {args.host or address}: {layout}, CHRONOS_METRICS_PORT={settings.metrics_port} "
                        f"(chronos targets)"), end="")
    return 0
