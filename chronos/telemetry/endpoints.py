"""Where each process serves /metrics and /healthz: one CHRONOS_METRICS_PORT base for a whole host.

Under supervisord (CHRONOS_PROCESS_NUM set) a process listens on base + role offset + process
number, so one base serves every program of a host without collisions. `chronos up` picks a
base whose every program port is free when none is set, and hands the console their URLs.
"""

from __future__ import annotations

import os
import random
import socket
from typing import Mapping

from chronos.errors import ConfigError

ROLE_OFFSETS = {"consumer": 0, "firer": 100, "detector": 200}
WILDCARDS = ("0.0.0.0", "::")  # CHRONOS_METRICS_ADDRESS values that mean every interface
# how often a serving process says again where it serves /metrics (chronos_processes), and how recently a
# process must have said so to be listed (the console, `chronos status`)
ANNOUNCE_EVERY_S = 30.0
ANNOUNCED_WITHIN_MS = 90_000

# Picked below the kernel's ephemeral range (32768-60999), where the embedded services' ports go.
_AUTO_METRICS_PORTS = (20000, 30000)


def metrics_port(role: str, base: int, environ: Mapping[str, str] | None = None) -> int:
    """The port this process serves on: 0 (off), the base, or base + role offset + process number."""
    environ = os.environ if environ is None else environ
    if base == 0:
        return 0
    num = environ.get("CHRONOS_PROCESS_NUM")
    if num is None or num == "":
        return base
    try:
        port = base + ROLE_OFFSETS[role] + int(num)
    except ValueError:
        raise ConfigError(f"CHRONOS_PROCESS_NUM must be a whole number, got {num!r}") from None
    if port > 65535:
        raise ConfigError(f"CHRONOS_METRICS_PORT {base} + {ROLE_OFFSETS[role]} ({role}) + process {num} "
                          f"is past 65535")
    return port


def program_ports(base: int, counts: Mapping[str, int]) -> list[int]:
    """The metrics port of every program supervisord runs, for a CHRONOS_METRICS_PORT base."""
    return [base + ROLE_OFFSETS[role] + n for role, count in counts.items() for n in range(count)]


def metrics_urls(base: int, counts: Mapping[str, int]) -> tuple[str, ...]:
    """The /metrics URL of every program supervisord runs."""
    return tuple(f"http://127.0.0.1:{p}/metrics" for p in program_ports(base, counts))


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_metrics_base(counts: Mapping[str, int], rng: random.Random | None = None) -> int:
    """A base port whose program ports are all free now."""
    rng = rng or random.Random()
    low, high = _AUTO_METRICS_PORTS
    for _ in range(100):
        base = rng.randrange(low, high - max(ROLE_OFFSETS.values()) - 64)
        if all(_free(p) for p in program_ports(base, counts)):
            return base
    raise ConfigError("found no free ports for the programs' /metrics: set CHRONOS_METRICS_PORT")
