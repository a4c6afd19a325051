"""The console's live figures cover every process of every host with no list of URLs: processes on two
addresses (a consumer that listens on 127.0.0.2 only, a firer and a detector on every interface, found at
the address they reach PostgreSQL from) say in PostgreSQL where they serve, and a console given no
CHRONOS_CONSOLE_METRICS_URLS scrapes them all; one given a URL of one of them counts that process once.
A process that stops takes its word back."""

from __future__ import annotations

import json
import os
import urllib.request

import psycopg

from chronos.embedded.procs import free_port
from consolekit import Console, wait_for


def overview(console: Console) -> dict:
    with urllib.request.urlopen(console.url + "api/overview", timeout=10) as answer:
        return json.loads(answer.read())


def test_a_console_with_no_urls_given_reads_the_processes_of_both_addresses(processes, chronos_env, tmp_path):
    consumer_port, firer_port, detector_port = free_port(), free_port(), free_port()
    consumer = processes.start("consumer", CHRONOS_METRICS_PORT=str(consumer_port), CHRONOS_METRICS_ADDRESS="127.0.0.2")
    firer = processes.start("firer", CHRONOS_METRICS_PORT=str(firer_port))
    detector = processes.start("detector", CHRONOS_METRICS_PORT=str(detector_port))
    for proc, url in ((consumer, f"http://127.0.0.2:{consumer_port}/metrics"),
                      (firer, f"http://127.0.0.1:{firer_port}/metrics"),
                      (detector, f"http://127.0.0.1:{detector_port}/metrics")):
        processes.wait_for_log(proc, f"told PostgreSQL this process serves {url}")
    env = {k: v for k, v in {**os.environ, **chronos_env}.items() if k != "CHRONOS_CONSOLE_METRICS_URLS"}

    def every(console: Console) -> dict | None:
        d = overview(console)
        rows = {row[0].split()[0]: row for row in d["postgres_processes"]}
        answered = d["metrics"] == {"sources": 3, "answering": 3} and all(
            rows.get(role, ["", "-"])[1] != "-" for role in ("consumer", "firer", "detector"))
        return d if answered else None

    console = Console(tmp_path, env=env)
    try:
        wait_for(lambda: every(console), 30, "every process scraped", console.proc, console.log)
    finally:
        console.stop()
    # the firer listed by hand at another address of the same host too: still three processes, not four
    console = Console(tmp_path, env={**env, "CHRONOS_CONSOLE_METRICS_URLS": f"http://localhost:{firer_port}/metrics"})
    try:
        wait_for(lambda: every(console), 30, "each process counted once", console.proc, console.log)
    finally:
        console.stop()
    processes.stop_all()
    with psycopg.connect(chronos_env["CHRONOS_DATABASE_URL"]) as conn:
        assert conn.execute("SELECT count(*) FROM chronos_processes").fetchone()[0] == 0
