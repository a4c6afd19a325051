"""The console's live figures cover every process of every host with no list of URLs: processes on two
addresses (a consumer that listens on 127.0.0.2 only, a firer on every interface, found at the address it
reaches PostgreSQL from) say in PostgreSQL where they serve, and a console given no
CHRONOS_CONSOLE_METRICS_URLS scrapes both; one given a URL of one of them counts that process once."""

from __future__ import annotations

import json
import os
import urllib.request

from chronos.embedded.procs import free_port
from consolekit import Console, wait_for


def overview(console: Console) -> dict:
    with urllib.request.urlopen(console.url + "api/overview", timeout=10) as answer:
        return json.loads(answer.read())


def test_a_console_with_no_urls_given_reads_the_processes_of_both_addresses(processes, chronos_env, tmp_path):
    consumer_port, firer_port = free_port(), free_port()
    consumer = processes.start("consumer", CHRONOS_METRICS_PORT=str(consumer_port), CHRONOS_METRICS_ADDRESS="127.0.0.2")
    firer = processes.start("firer", CHRONOS_METRICS_PORT=str(firer_port))
    for proc, url in ((consumer, f"http://127.0.0.2:{consumer_port}/metrics"),
                      (firer, f"http://127.0.0.1:{firer_port}/metrics")):
        processes.wait_for_log(proc, f"told PostgreSQL this process serves {url}")
    env = {k: v for k, v in {**os.environ, **chronos_env}.items() if k != "CHRONOS_CONSOLE_METRICS_URLS"}

    def both(console: Console) -> dict | None:
        d = overview(console)
        rows = {row[0].split()[0]: row for row in d["postgres_processes"]}
        answered = d["metrics"] == {"sources": 2, "answering": 2} and all(
            rows.get(role, ["", "-"])[1] != "-" for role in ("consumer", "firer"))
        return d if answered else None

    console = Console(tmp_path, env=env)
    try:
        wait_for(lambda: both(console), 30, "both processes scraped", console.proc, console.log)
    finally:
        console.stop()
    # the firer listed by hand at another address of the same host too: still two processes, not three
    console = Console(tmp_path, env={**env, "CHRONOS_CONSOLE_METRICS_URLS": f"http://localhost:{firer_port}/metrics"})
    try:
        wait_for(lambda: both(console), 30, "each process counted once", console.proc, console.log)
    finally:
        console.stop()
