"""`python -m benchmarks.console_cost`: what open consoles cost PostgreSQL and the console process.

Starts `chronos up` (with its console), writes `--rows` far-future messages into its store, then
measures the CPU of the console process and of PostgreSQL (all its processes) for `--seconds`
twice: once with no client, once with `--clients` clients that each load the overview page and
then fetch its live JSON every second, as the page's script does. Prints both windows, the
difference, and the machine's load average (the machine may be shared: read the figures with it).

    python -m benchmarks.console_cost                      # 10 clients, 60 s
    python -m benchmarks.console_cost --clients 50 --seconds 30
"""

from __future__ import annotations

import argparse
import http.client
import os
import threading
import time
from urllib.parse import urlsplit

import orjson

from benchmarks.harness.database import DAY_S, fill_far
from benchmarks.harness.procstat import CpuMeter
from kits.stack import ChronosUp, layout_args
from chronos.embedded.procs import descendants


def console_pid(up_pid: int) -> int:
    for pid in descendants(up_pid):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"console" in cmdline and b"chronos" in cmdline:
            return pid
    raise RuntimeError("no console process under chronos up (is the console extra installed?)")


def client(url: str, stop: threading.Event, counts: list[int], errors: list[str]) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        for path in ("/", "/static/console.css", "/static/console.js"):
            conn.request("GET", path)
            conn.getresponse().read()
        while not stop.is_set():
            started = time.monotonic()
            conn.request("GET", "/api/overview")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                errors.append(str(response.status))
            counts.append(1)
            stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
    except OSError as exc:
        errors.append(str(exc))
    finally:
        conn.close()


def window(info: dict, console: int, seconds: float, clients: int) -> dict:
    meter = CpuMeter({"console": (console, False), "postgres": (info["postgres_pid"], True)})
    stop = threading.Event()
    counts: list[int] = []
    errors: list[str] = []
    threads = [threading.Thread(target=client, args=(info["console_url"], stop, counts, errors), daemon=True)
               for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2.0 if clients else 0.0)  # let the clients load the page before measuring
    load_before = os.getloadavg()[0]
    meter.start(time.monotonic())
    end = time.monotonic() + seconds
    requests_before = len(counts)
    while time.monotonic() < end:
        time.sleep(1.0)
        meter.sample()
    result = meter.stop(time.monotonic())
    served = len(counts) - requests_before
    stop.set()
    for t in threads:
        t.join(5)
    total = result["console"]["cores"] + result["postgres"]["cores"]
    return {"clients": clients, "seconds": seconds, "requests": served, "errors": errors[:5],
            "console_pct": round(100 * result["console"]["cores"], 2),
            "postgres_pct": round(100 * result["postgres"]["cores"], 2), "total_pct": round(100 * total, 2),
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.console_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rows", type=int, default=100_000, help="far-future messages in the store (default 100,000)")
    args = p.parse_args()
    stack = ChronosUp(*layout_args(1, 1, 1), "--console-port", "0")
    info = stack.start()
    try:
        fill_far(info["database_url"], args.rows, prefix="bench-", ahead_s=DAY_S)
        console = console_pid(info["pid"])
        idle = window(info, console, args.seconds, 0)
        busy = window(info, console, args.seconds, args.clients)
    finally:
        stack.stop()
    report = {"rows": args.rows, "cores": os.cpu_count(), "idle": idle, "with_clients": busy,
              "clients_cost_pct": round(busy["total_pct"] - idle["total_pct"], 2)}
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
