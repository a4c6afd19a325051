"""The Prometheus targets of one host's programs, from the host's own settings (`chronos targets`,
chronos/commands/targets.py).

A host runs CHRONOS_CONSUMERS, CHRONOS_FIRERS and CHRONOS_DETECTORS programs (supervisord's numprocs),
each serving /metrics on CHRONOS_METRICS_PORT + its role's offset + its process number
(chronos.telemetry.endpoints). The command prints the file-based discovery groups of exactly those
programs, so that the targets Prometheus scrapes are the ones the host runs: a role it runs none of has
no group, and `up == 0` (ChronosTargetDown) means a program that should answer and does not.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Mapping

from chronos.errors import ConfigError
from chronos.telemetry.endpoints import ROLE_OFFSETS

# supervisord.conf's process counts, in the order of the roles' offsets
COUNTS = {"consumer": "CHRONOS_CONSUMERS", "firer": "CHRONOS_FIRERS", "detector": "CHRONOS_DETECTORS"}


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
