"""The operators' commands over cells, through the CLI: `chronos migrate` migrating every cell (a cell that does not
answer named, the others migrated, and the rest done when run again) and assigning their input partitions,
`chronos schedules` naming the cell of each schedule, `chronos parked` naming each parked message CELL#NUMBER and
replaying those of every cell."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import orjson
import psycopg
from psycopg.conninfo import conninfo_to_dict

from chronos import codec
from chronos.adapters.postgres.migrations import LATEST_VERSION
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Parked
from helpers import Collector


def chronos(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "chronos", *args], capture_output=True, text=True, timeout=60)
    assert not check or out.returncode == 0, out.stderr
    return out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_migrate_migrates_every_cell_assigns_their_partitions_and_finishes_the_job_when_run_again(two_empty_cells):
    a, b = two_empty_cells["a"], two_empty_cells["b"]
    host = conninfo_to_dict(b)
    away = b.replace(f"{host['host']}:{host['port']}", f"127.0.0.1:{closed_port()}")
    half = chronos("migrate", "--cells", f"a={a} b={away}", check=False)
    assert half.returncode == 3, half.stderr
    assert "cell a: applied migrations 1, " in half.stdout
    assert "cell b: not migrated: cannot connect to" in half.stdout
    assert "1 of 2 cells not migrated (b): run chronos migrate again" in half.stderr
    unassigned = chronos("migrate", "--cells", f"a={a} b={b}", check=False)
    assert unassigned.returncode == 2 and "list no input partition yet: give --partitions" in unassigned.stderr
    assert "cell b: applied migrations 1, " in unassigned.stdout
    done = chronos("migrate", "--cells", f"a={a} b={b}", "--partitions", "8")
    assert f"cell a: schema already at version {LATEST_VERSION}" in done.stdout
    assert f"cell b: schema already at version {LATEST_VERSION}" in done.stdout
    assert "assigned the input partitions: a 0-3, b 4-7" in done.stdout
    again = chronos("migrate", "--cells", f"a={a} b={b}")
    assert "cells own the input partitions: a 0-3, b 4-7" in again.stdout
    for url in (a, b):
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT max(version) FROM chronos_schema_version").fetchone() == (LATEST_VERSION,)


def test_schedules_lists_every_cells_schedules_each_with_its_cell(two_cells):
    for cell, sid, minutes in (("b", "tick-b", 1), ("a", "tick-a", 2)):
        with psycopg.connect(two_cells[cell], autocommit=True) as conn:
            conn.execute("INSERT INTO chronos_messages (id, deadline, value, headers, cron) "
                         "VALUES (%s, now() + make_interval(mins => %s), 'v', '', '* * * * *')", (sid, minutes))
    cells = " ".join(f"{name}={url}" for name, url in two_cells.items())
    listed = orjson.loads(chronos("schedules", "--json", "--cells", cells).stdout)
    assert [(s["id"], s["cell"]) for s in listed] == [("tick-b", "b"), ("tick-a", "a")]
    text = chronos("schedules", "--cells", cells).stdout.splitlines()
    assert text[0].split()[:3] == ["ID", "CELL", "CRON"]
    assert text[1].split()[:2] == ["tick-b", "b"] and text[2].split()[:2] == ["tick-a", "a"]


def test_parked_messages_of_every_cell_listed_shown_and_replayed_each_named_with_its_cell(two_cells, broker, topics):
    for cell in ("a", "b"):
        store = Store(two_cells[cell])
        store.park([Parked(f"in-{cell}", f"store/in-{cell}", topics["output"], None, b"k", f"in-{cell}".encode(),
                           codec.encode_headers([]), "too_large: MSG_SIZE_TOO_LARGE: too large")])
        store.close()
    cells = ["--cells", " ".join(f"{name}={url}" for name, url in two_cells.items())]
    listed = chronos("parked", "list", *cells).stdout.splitlines()
    assert sorted(line.split()[0] + " " + line.split()[2] for line in listed) == ["a#1 'in-a'", "b#1 'in-b'"]
    shown = chronos("parked", "show", "b#1", *cells).stdout
    assert re.search(r"^number +b#1$", shown, re.M) and re.search(r"^cell +b$", shown, re.M)
    assert re.search(r"^id +'in-b'$", shown, re.M)
    bare = chronos("parked", "drop", "1", *cells, check=False)
    assert bare.returncode == 2 and "with cells a parked message is CELL#NUMBER" in bare.stderr
    replayed = chronos("parked", "replay", "a#1", "b#1", *cells, "--kafka-bootstrap-servers", broker.bootstrap_servers,
                       "--output-topic", topics["output"])
    assert replayed.stdout.startswith("2 replayed to their topics (a 1, b 1): a#1, b#1"), replayed.stdout
    assert chronos("parked", "list", *cells).stdout.strip() == "no parked messages match"
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    try:
        assert sorted(m.value for m in collect.until(lambda ms: len(ms) >= 2)) == [b"in-a", b"in-b"]
    finally:
        collect.close()
