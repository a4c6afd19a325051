"""`chronos targets`: the Prometheus targets of one host's programs, from the host's own settings.

A host runs CHRONOS_CONSUMERS, CHRONOS_FIRERS and CHRONOS_DETECTORS programs (supervisord's numprocs),
each serving /metrics on CHRONOS_METRICS_PORT + its role's offset + its process number
(chronos.telemetry.endpoints). The command prints the file-based discovery groups of exactly those
programs, so that the targets Prometheus scrapes are the ones the host runs: a role it runs none of has
no group, and `up == 0` (ChronosTargetDown) means a program that should answer and does not.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from typing import Any, Mapping

from chronos import config
from chronos.errors import ConfigError
from chronos.telemetry.endpoints import ROLE_OFFSETS, WILDCARDS

# supervisord.conf's process counts, in the order of the roles' offsets
COUNTS = {"consumer": "CHRONOS_CONSUMERS", "firer": "CHRONOS_FIRERS", "detector": "CHRONOS_DETECTORS"}


def add_parser(sub: Any) -> None:
    """The `targets` sub-command."""
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
    p.set_defaults(func=cmd_targets)


def groups(address: str, base: int, counts: Mapping[str, int], *, host: str | None = None) -> list[dict[str, Any]]:
    """The file-based discovery groups of one host: for each role it runs at least one program of, the
    programs' `address:port` targets, labelled with the host and the role (`program`)."""
    shown = f"[{address}]" if ":" in address else address
    return [{"targets": [f"{shown}:{base + ROLE_OFFSETS[role] + n}" for n in range(counts.get(role, 0))],
             "labels": {"host": host or address, "program": role}}
            for role in ROLE_OFFSETS if counts.get(role, 0) > 0]


def render(found: list[dict[str, Any]], comment: str) -> str:
    """The groups as a targets file (YAML, strings quoted as JSON writes them), under a comment line."""
    lines = [f"# {comment}"]
    for group in found:
        lines.append(f"- targets: [{', '.join(json.dumps(t) for t in group['targets'])}]")
        lines.append("  labels: {" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in group["labels"].items()) + "}")
    if not found:
        lines.append("[]")
    return "\n".join(lines) + "\n"


def counts_of(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, int]:
    """The programs of each role on the host: the flags, else supervisord's variables."""
    counts = {}
    for role, env in COUNTS.items():
        raw = getattr(args, f"{role}s", None)
        if raw is None:
            text = environ.get(env)
            if text is None or not text.strip():
                raise ConfigError(f"{env} is not set: give the host's environment file (the one supervisord is "
                                  f"started with), or --{role}s")
            try:
                raw = int(text)
            except ValueError:
                raise ConfigError(f"{env} must be a whole number, got {text!r}") from None
        if raw < 0:
            raise ConfigError(f"{env} must be 0 or more, got {raw}")
        counts[role] = raw
    return counts


def cmd_targets(args: argparse.Namespace) -> int:
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
