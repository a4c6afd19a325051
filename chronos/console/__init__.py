"""The web console (`chronos console`, the `console` extra): watch the schedule live, find a
message, act on it.

Importing this package loads no web framework: the CLI builds its parser from here, and the
service processes never import the console at all. `chronos.console.server` is the part that
needs the extra.
"""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config
from chronos.errors import ConfigError

INSTALL_HINT = "pip install 'chronos-scheduler[console]'"


def add_parser(sub: Any) -> None:
    """The `console` sub-command."""
    p = sub.add_parser("console", help="serve the web console (overview, messages, schedules, actions)",
                       description="Serve the web console. Read-only unless CHRONOS_CONSOLE_TOKEN is set. "
                                   f"Needs the console extra: {INSTALL_HINT}")
    config.add_arguments(p, only=("database_url", "database_pool_mode", "hold_time_ms", "console_host",
                                  "console_port", "console_token", "console_metrics_urls", "metrics_scrape_config_file",
                                  "log_level", "log_format"))
    p.add_argument("--host", dest="console_host", metavar="CHRONOS_CONSOLE_HOST", default=None,
                   help="same as --console-host (default 127.0.0.1: this machine only)")
    p.add_argument("--port", dest="console_port", metavar="CHRONOS_CONSOLE_PORT", default=None,
                   help="same as --console-port (default 9700)")
    # `chronos up` hands over a socket it has bound already, so the port is never raced for
    p.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_console)


def missing_extra() -> str | None:
    """The name of a package of the console extra that is not installed, or None."""
    import importlib.util
    for name in ("starlette", "uvicorn", "jinja2"):
        if importlib.util.find_spec(name) is None:
            return name
    return None


def cmd_console(args: argparse.Namespace) -> int:
    missing = missing_extra()
    if missing:
        raise ConfigError(f"the console needs the console extra ({missing} is not installed): {INSTALL_HINT}")
    settings = config.load(args)
    settings.require_database()
    from chronos.console.server import serve
    return serve(settings, fd=args.fd)
