"""`chronos health`: ask a process's /healthz, or every process's."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

import orjson

from chronos import config
from chronos.errors import EXIT_FAILURE, EXIT_UNAVAILABLE, ConfigError
from chronos.telemetry import scrape, webconfig
from chronos.telemetry.endpoints import WILDCARDS
from chronos.telemetry.scrape import Scraper


def add_parser(sub: Any) -> None:
    p = sub.add_parser("health", help="ask a process's /healthz, or every process's; exit 0 when healthy",
                       description="GET a process's /healthz and print its JSON report. Exit 0 when healthy, "
                                   "1 when the process reports a problem, 3 when it does not answer. Without "
                                   "--url or --metrics-port, asks every process whose /metrics URL is known (the "
                                   "ready file of `chronos up`, CHRONOS_CONSOLE_METRICS_URLS): one report per "
                                   "line, exit 0 when all are healthy, 3 when none answers, else 1.")
    config.add_arguments(p, only=("metrics_port", "metrics_address", "metrics_web_config_file",
                                  "metrics_scrape_config_file", "console_metrics_urls"))
    p.add_argument("--url", default=None,
                   help="health URL (default: the process's on this host, CHRONOS_METRICS_PORT on "
                        "CHRONOS_METRICS_ADDRESS, or 127.0.0.1 where that is every interface, over HTTPS when "
                        "CHRONOS_METRICS_WEB_CONFIG_FILE has a certificate; else every process's)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer (default 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = config.load(args, default_ready_file=args.url is None and args.metrics_port is None)
    scraper = Scraper(scrape.load("CHRONOS_METRICS_SCRAPE_CONFIG_FILE", settings.metrics_scrape_config_file))
    url = args.url
    if url is None:
        if settings.metrics_port:
            url = local_url(settings, settings.metrics_port, "/healthz")
        elif settings.console_metrics_urls:
            return health_of_all([u.rsplit("/", 1)[0] + "/healthz" for u in settings.console_metrics_urls],
                                 args.timeout, scraper)
        else:
            raise ConfigError("give --url, or --metrics-port / CHRONOS_METRICS_PORT of the process to ask, or "
                              "CHRONOS_CONSOLE_METRICS_URLS (or a ready file) to ask every process")
    status, body = ask_health(url, args.timeout, scraper)
    if status == 0:
        return EXIT_UNAVAILABLE
    sys.stdout.write(body.decode(errors="replace"))
    if not body.endswith(b"\n"):
        sys.stdout.write("\n")
    return 0 if status == 200 else EXIT_FAILURE


def local_url(settings: config.Settings, port: int, path: str) -> str:
    """The URL of a process's `path` on this host, on `port`: at CHRONOS_METRICS_ADDRESS (127.0.0.1 where
    the processes listen on every interface), over HTTPS when their web configuration has a certificate."""
    host = settings.metrics_address
    if host in WILDCARDS:
        host = "127.0.0.1"
    tls = webconfig.load("CHRONOS_METRICS_WEB_CONFIG_FILE", settings.metrics_web_config_file or "").tls
    return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}{path}"


def ask_health(url: str, timeout: float, scraper: Scraper | None = None) -> tuple[int, bytes]:
    """(HTTP status, body) of a /healthz; (0, b"") when nothing answers, said on stderr."""
    try:
        return (scraper or Scraper()).get(url, timeout)
    except (OSError, ValueError) as exc:
        print(f"chronos health: no answer from {url}: {exc}", file=sys.stderr)
        return 0, b""


def health_of_all(urls: Sequence[str], timeout: float, scraper: Scraper | None = None) -> int:
    """Every process's /healthz, one report per line with its URL; 0 when all are healthy, 3 when none
    answers, else 1."""
    answers = [(url, *ask_health(url, timeout, scraper)) for url in urls]
    for url, status, body in answers:
        if status:
            try:
                report = orjson.loads(body)
            except ValueError:
                report = {"status": "unreadable", "body": body.decode(errors="replace")[:200]}
            print(orjson.dumps({"url": url, **report}).decode())
    if all(status == 200 for _, status, _ in answers):
        return 0
    return EXIT_UNAVAILABLE if not any(status for _, status, _ in answers) else EXIT_FAILURE
