"""`chronos console`: serve the web console (the console extra; chronos/console/ is the console)."""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config
from chronos.console import INSTALL_HINT, missing_extra
from chronos.errors import ConfigError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("console", help="serve the web console (overview, messages, schedules, actions)",
                       description="Serve the web console (with CHRONOS_CELLS, of every cell). Read-only unless "
                                   "CHRONOS_CONSOLE_TOKEN is set. "
                                   f"Needs the console extra: {INSTALL_HINT}")
    # the Kafka settings, the dead-letter topic and the allow-list are a replay's (the Parked page's actions)
    config.add_arguments(p, only=("database_url", "cells", "database_pool_mode", "hold_time_ms", "console_host",
                                  "console_port", "console_token", "console_metrics_urls", "metrics_scrape_config_file",
                                  "log_level", "log_format",
                                  "kafka_bootstrap_servers", "kafka_properties", "kafka_properties_file", "dlq_topic",
                                  "allowed_topics"))
    p.add_argument("--host", dest="console_host", metavar="CHRONOS_CONSOLE_HOST", default=None,
                   help="same as --console-host (default 127.0.0.1: this machine only)")
    p.add_argument("--port", dest="console_port", metavar="CHRONOS_CONSOLE_PORT", default=None,
                   help="same as --console-port (default 9700)")
    # `chronos up` hands over a socket it has bound already, so the port is never raced for
    p.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    missing = missing_extra()
    if missing:
        raise ConfigError(f"the console needs the console extra ({missing} is not installed): {INSTALL_HINT}")
    settings = config.load(args)
    settings.databases()  # a database, or the cells, or a configuration error
    from chronos.console.server import serve
    return serve(settings, fd=args.fd)
