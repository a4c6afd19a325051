"""The embedded broker's stats file, as the processes (their gauges) and `chronos status` read it: `chronos up`
writes it (chronos.embedded.watch) and names it in the programs' environment. Below the embedded services, so
that a production process reads it without importing them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

# the environment variable that tells the programs where the stats file is
STATS_ENV = "CHRONOS_EMBEDDED_BROKER_STATS"


def rss_bytes(pid: int) -> int | None:
    """Resident memory of process `pid` in bytes (Linux /proc), None when it is gone or unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_stats(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The stats file as a dict, None when it is missing or unreadable (the stack is not embedded,
    or not started yet)."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
