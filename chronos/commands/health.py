"""`chronos health`: ask a process's /healthz, or every process's."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from typing import Any, Sequence

import orjson

from chronos import config
from chronos.errors import EXIT_FAILURE, EXIT_UNAVAILABLE, ConfigError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("health", help="ask a process's /healthz, or every process's; exit 0 when healthy",
                       description="GET a process's /healthz and print its JSON report. Exit 0 when healthy, "
                                   "1 when the process reports a problem, 3 when it does not answer. Without "
                                   "--url or --metrics-port, asks every process whose /metrics URL is known (the "
                                   "ready file of `chronos up`, CHRONOS_CONSOLE_METRICS_URLS): one report per "
                                   "line, exit 0 when all are healthy, 3 when none answers, else 1.")
    config.add_arguments(p, only=("metrics_port", "console_metrics_urls"))
    p.add_argument("--url", default=None,
                   help="health URL (default: http://127.0.0.1:CHRONOS_METRICS_PORT/healthz, else every "
                        "process's)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer (default 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    url = args.url
    if url is None:
        settings = config.load(args, default_ready_file=args.metrics_port is None)
        if settings.metrics_port:
            url = f"http://127.0.0.1:{settings.metrics_port}/healthz"
        elif settings.console_metrics_urls:
            return health_of_all([u.rsplit("/", 1)[0] + "/healthz" for u in settings.console_metrics_urls],
                                 args.timeout)
        else:
            raise ConfigError("give --url, or --metrics-port / CHRONOS_METRICS_PORT of the process to ask, or "
                              "CHRONOS_CONSOLE_METRICS_URLS (or a ready file) to ask every process")
    status, body = ask_health(url, args.timeout)
    if status == 0:
        return EXIT_UNAVAILABLE
    sys.stdout.write(body.decode(errors="replace"))
    if not body.endswith(b"\n"):
        sys.stdout.write("\n")
    return 0 if status == 200 else EXIT_FAILURE


def ask_health(url: str, timeout: float) -> tuple[int, bytes]:
    """(HTTP status, body) of a /healthz; (0, b"") when nothing answers, said on stderr."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"chronos health: no answer from {url}: {reason}", file=sys.stderr)
        return 0, b""


def health_of_all(urls: Sequence[str], timeout: float) -> int:
    """Every process's /healthz, one report per line with its URL; 0 when all are healthy, 3 when none
    answers, else 1."""
    answers = [(url, *ask_health(url, timeout)) for url in urls]
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
