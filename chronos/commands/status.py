"""`chronos status`: what the store holds, at a glance, once or every few seconds (chronos/ops/status.py
builds and renders it; the console shows the same)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

import orjson

from chronos import config
from chronos.errors import StoreUnavailable

if TYPE_CHECKING:
    from chronos.telemetry.scrape import Scraper


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="what the store holds: waiting, due, held per firer, overdue, "
                                      "suspected failures, recurring schedules, throttled topics, next deadline; "
                                      "the PostgreSQL server and the processes on it",
                       description="Read the store and print what it holds, and which PostgreSQL server it is "
                                   "(primary or standby, its standbys) with the processes connected to it; with "
                                   "the processes' /metrics URLs known (the ready file of `chronos up`, "
                                   "CHRONOS_CONSOLE_METRICS_URLS), the server each process says it uses. Runs "
                                   "against the same settings (or --ready-file) as every other command.")
    config.add_arguments(p, only=("database_url", "cells", "database_pool_mode", "hold_time_ms", "output_topic",
                                  "console_metrics_urls", "metrics_scrape_config_file"))
    p.add_argument("--json", action="store_true", help="one JSON object (one per line with --watch)")
    p.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
                   help="refresh every SECONDS (default 2) until Ctrl-C")
    p.add_argument("--exact", action="store_true",
                   help="count waiting rows exactly even on a very large table (slower)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronos.adapters.postgres.store import Store
    from chronos.ops.cells import read_map
    from chronos.ops.status import broker_stats, cells_dict, render, render_cells
    from chronos.telemetry import scrape
    from chronos.telemetry.scrape import Scraper
    settings = config.load(args)
    scraper = Scraper(scrape.load("CHRONOS_METRICS_SCRAPE_CONFIG_FILE", settings.metrics_scrape_config_file))
    stores = {cell: Store(url, pool_mode=settings.database_pool_mode, application_name="chronos status")
              for cell, url in settings.databases().items()}
    clear = args.watch is not None and not args.json and sys.stdout.isatty()
    stop = threading.Event()
    if args.watch is not None:
        # Ctrl-C or SIGTERM end a watch, even where SIGINT came in ignored (a shell's background job)
        # and even if the interrupt lands where a library swallows it: the loop checks the flag too
        def interrupt(_signum, _frame) -> None:
            stop.set()
            raise KeyboardInterrupt
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, interrupt)
    try:
        while not stop.is_set():
            try:
                if settings.cells:
                    cells = {cell: snapshot(store, settings, args, scraper, broker=None) for cell, store in stores.items()}
                    d = cells_dict(cells, read_map(stores), broker_stats(args))
                else:
                    d = snapshot(stores[""], settings, args, scraper, broker=broker_stats(args))
            except StoreUnavailable as exc:
                if args.watch is None:
                    raise
                print(f"postgres unavailable: {exc}", file=sys.stderr, flush=True)
            else:
                if args.json:
                    out = orjson.dumps(d, option=0 if args.watch is not None else orjson.OPT_INDENT_2).decode()
                else:
                    text = render_cells(d) if settings.cells else render(d)
                    out = ("\x1b[H\x1b[2J" if clear else "") + text + ("" if clear else "\n")
                print(out, flush=True)
            if args.watch is None:
                return 0
            stop.wait(max(0.1, args.watch))
        return 0
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `chronos status --watch | head`: the reader is done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        for store in stores.values():
            store.close()


def snapshot(store: Any, settings: config.Settings, args: argparse.Namespace, scraper: Scraper,
             broker: dict[str, Any] | None) -> dict[str, Any]:
    """What one database holds, its server and the processes on it (`to_dict`)."""
    from chronos.ops import servers
    from chronos.ops.status import postgres_dict, to_dict
    from chronos.telemetry.endpoints import ANNOUNCED_WITHIN_MS
    view = store.overview(settings.hold_time_ms, exact=True if args.exact else None)
    urls = list(dict.fromkeys([*settings.console_metrics_urls, *(a.url for a in store.announced(ANNOUNCED_WITHIN_MS))]))
    postgres = postgres_dict(store.server_view(), view.by_node,
                             servers.unique(servers.ask(urls, scraper=scraper)) if urls else None)
    return to_dict(view, settings.hold_time_ms, store.throttled(settings.output_topic), broker, postgres)
