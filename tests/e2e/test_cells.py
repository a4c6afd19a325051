"""Cells end to end, with real processes: a firer or a detector serves the one cell CHRONOS_CELL names (or the
cells in turn by its process number), on that cell's database."""

from __future__ import annotations

import psycopg

from helpers import Collector


def due_row(url: str, mid: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline, value, headers) VALUES (%s, now(), %s, '')",
                     (mid, mid.encode()))


def test_a_firer_of_one_cell_fires_that_cells_rows_only(processes, broker, topics, two_cells):
    cells = " ".join(f"{name}={url}" for name, url in two_cells.items())
    due_row(two_cells["a"], "in-a")
    due_row(two_cells["b"], "in-b")
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    firer = processes.start("firer", CHRONOS_CELLS=cells, CHRONOS_CELL="b", CHRONOS_DATABASE_URL="")
    started = processes.wait_for_log(firer, "starting: node")
    assert "(cell b)" in started.splitlines()[-1]
    got = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    collect.poll_for(1.0)
    collect.close()
    assert [m.value for m in got] == [b"in-b"]
    with psycopg.connect(two_cells["a"]) as conn:
        assert conn.execute("SELECT id FROM chronos_messages").fetchall() == [("in-a",)]
