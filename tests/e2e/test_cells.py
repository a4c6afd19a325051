"""Cells end to end, with real processes: a firer or a detector serves the one cell CHRONOS_CELL names (or the
cells in turn by its process number), on that cell's database; a consumer writes each message to the cell of its
input partition."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from psycopg.conninfo import conninfo_to_dict

from chronos.adapters.postgres.store import Store
from chronos.client import Scheduler
from chronos.domain.routing import input_partition
from helpers import Collector, wait_for
from kits.proxy import FreezableProxy


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
    # the log may hold the lines after it too by the time it is read
    assert "(cell b)" in next(line for line in started.splitlines() if "starting: node" in line)
    got = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    collect.poll_for(1.0)
    collect.close()
    assert [m.value for m in got] == [b"in-b"]
    with psycopg.connect(two_cells["a"]) as conn:
        assert conn.execute("SELECT id FROM chronos_messages").fetchall() == [("in-a",)]


def test_a_consumer_writes_each_message_to_its_partitions_cell_and_each_cells_firer_fires_it(processes, broker,
                                                                                         topics, two_cells):
    for cell, share in (("a", [0, 1]), ("b", [2, 3])):
        store = Store(two_cells[cell])
        store.open_partitions(share, 1)
        store.close()
    cells = " ".join(f"{name}={url}" for name, url in two_cells.items())
    env = {"CHRONOS_CELLS": cells, "CHRONOS_DATABASE_URL": ""}
    consumer = processes.start("consumer", **env)
    assert "cells: a (partitions 0-1), b (partitions 2-3)" in processes.wait_for_log(consumer, "cells: ")
    with Scheduler(broker.bootstrap_servers, input_topic=topics["input"]) as s:
        ids = [s.send_later(f"k{i}", f"far-{i}", delay=timedelta(hours=1)) for i in range(12)]
    owner = {p: "a" if p < 2 else "b" for p in range(4)}
    wanted = {cell: sorted(mid for mid in ids if owner[input_partition(mid, None, 4)] == cell) for cell in two_cells}
    assert wanted["a"] and wanted["b"]
    wait_for(lambda: {cell: ids_in(url) for cell, url in two_cells.items()} == wanted, 30, "each row in its cell")
    # each cell's firer fires what its cell holds
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    for cell in two_cells:
        processes.start("firer", CHRONOS_CELL=cell, **env)
    with Scheduler(broker.bootstrap_servers, input_topic=topics["input"]) as s:
        for i in range(6):
            s.send_later(f"k{i}", f"soon-{i}", delay=1.0)
    got = collect.until(lambda ms: len(ms) >= 6, timeout=30)
    collect.close()
    assert sorted(m.value for m in got) == sorted(f"soon-{i}".encode() for i in range(6))


def ids_in(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM chronos_messages ORDER BY id")]


def test_a_frozen_cell_holds_only_its_own_partitions(processes, broker, topics, two_cells):
    """Cell b's PostgreSQL hangs (a proxy that stops forwarding): the consumer gives its part up after the
    statement's deadline, pauses its partitions and writes cell a's on time; once b answers, b's messages are
    read again and written, none lost."""
    for cell, share in (("a", [0, 1]), ("b", [2, 3])):
        store = Store(two_cells[cell])
        store.open_partitions(share, 1)
        store.close()
    params = conninfo_to_dict(two_cells["b"])
    proxy = FreezableProxy((str(params["host"]), int(params["port"])))
    try:
        via_proxy = two_cells["b"].replace(f"{params['host']}:{params['port']}", proxy.address)
        consumer = processes.start("consumer", CHRONOS_CELLS=f"a={two_cells['a']} b={via_proxy}",
                                   CHRONOS_DATABASE_URL="", CHRONOS_DATABASE_TIMEOUT_MS="1000")
        processes.wait_for_log(consumer, "cells: ")
        proxy.freeze()
        with Scheduler(broker.bootstrap_servers, input_topic=topics["input"]) as s:
            ids = [s.send_later(f"k{i}", f"v{i}", delay=timedelta(hours=1)) for i in range(16)]
        wanted = {cell: sorted(mid for mid in ids if (input_partition(mid, None, 4) < 2) == (cell == "a"))
                  for cell in two_cells}
        assert wanted["a"] and wanted["b"]
        processes.wait_for_log(consumer, "cell b does not answer: its partitions are paused")
        # while b hangs, a's partitions flow on: a second wave is written to a
        with Scheduler(broker.bootstrap_servers, input_topic=topics["input"]) as s:
            more = [s.send_later(f"k{i}", f"v{i}", delay=timedelta(hours=1)) for i in range(16)]
        ids += more
        wanted = {cell: sorted(mid for mid in ids if (input_partition(mid, None, 4) < 2) == (cell == "a"))
                  for cell in two_cells}
        wait_for(lambda: ids_in(two_cells["a"]) == wanted["a"], 15, "cell a's messages written while b hangs")
        assert ids_in(two_cells["b"]) == []
        proxy.thaw()
        wait_for(lambda: ids_in(two_cells["b"]) == wanted["b"], 30, "cell b's messages once it answers")
        assert "cell b answers again" in processes.log_of(consumer)
    finally:
        proxy.close()
