"""Cells end to end, with real processes: a firer or a detector serves the one cell CHRONOS_CELL names (or the
cells in turn by its process number), on that cell's database; a consumer writes each message to the cell of its
input partition, and leaves its group only when it alone cannot reach a cell."""

from __future__ import annotations

import re
import urllib.request
from datetime import timedelta

import psycopg
from psycopg.conninfo import conninfo_to_dict

from chronos.adapters.postgres.store import Store
from chronos.client import Scheduler
from chronos.domain.routing import input_partition
from chronos.embedded.procs import free_port
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


def send_far(broker, topics) -> list[str]:
    """16 messages due in an hour, sent by the client (routed by their ids): their ids."""
    with Scheduler(broker.bootstrap_servers, input_topic=topics["input"]) as s:
        return [s.send_later(f"k{i}", f"v{i}", delay=timedelta(hours=1)) for i in range(16)]


def split_ab(ids: list[str]) -> dict[str, list[str]]:
    """`ids` by cell, where cell a owns input partitions 0 and 1 of 4 and cell b the others."""
    return {cell: sorted(mid for mid in ids if (input_partition(mid, None, 4) < 2) == (cell == "a")) for cell in "ab"}


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
        ids = send_far(broker, topics)
        wanted = split_ab(ids)
        assert wanted["a"] and wanted["b"]
        processes.wait_for_log(consumer, "cell b does not answer: its partitions are paused")
        # while b hangs, a's partitions flow on: a second wave is written to a
        ids += send_far(broker, topics)
        wanted = split_ab(ids)
        wait_for(lambda: ids_in(two_cells["a"]) == wanted["a"], 15, "cell a's messages written while b hangs")
        assert ids_in(two_cells["b"]) == []
        proxy.thaw()
        wait_for(lambda: ids_in(two_cells["b"]) == wanted["b"], 30, "cell b's messages once it answers")
        assert "cell b answers again" in processes.log_of(consumer)
    finally:
        proxy.close()


def assigned(port: int) -> set[int]:
    """The input partitions a consumer says (its lag gauge, sampled every 5 s) are assigned to it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {int(p) for p in re.findall(r'^chronos_consumer_lag_messages\{[^}]*partition="(\d+)"', text, re.M)}


def test_a_consumer_alone_cut_off_from_a_cell_leaves_its_group_for_another_that_reaches_it(processes, broker, topics,
                                                                                        two_cells, chronos_env):
    """Two consumers of one group, each reaching cell b through a proxy of its own; one of them holds both of b's
    partitions, so the other never commits there. b hangs for both: neither leaves the group (the other could
    not write b's partitions either). Then b answers the other one only: the holder leaves the group once the
    other has said, in cell a, that it reached b, and the other writes b's messages while the holder is still
    cut off from b."""
    for cell, share in (("a", [0, 1]), ("b", [2, 3])):
        store = Store(two_cells[cell])
        store.open_partitions(share, 1)
        store.close()
    params = conninfo_to_dict(two_cells["b"])
    proxies = {name: FreezableProxy((str(params["host"]), int(params["port"]))) for name in ("one", "two")}
    try:
        consumers, ports = {}, {name: free_port() for name in proxies}
        for name, proxy in proxies.items():
            # a second to connect: connecting through a frozen proxy hangs as long as it may
            via_proxy = two_cells["b"].replace(f"{params['host']}:{params['port']}", proxy.address) + "?connect_timeout=1"
            consumers[name] = processes.start(
                "consumer", CHRONOS_CELLS=f"a={two_cells['a']} b={via_proxy}", CHRONOS_DATABASE_URL="",
                CHRONOS_DATABASE_TIMEOUT_MS="1000", CHRONOS_METRICS_PORT=str(ports[name]))
        for consumer in consumers.values():
            processes.wait_for_log(consumer, "serving /metrics")
        # the range assignor gives each of the two consumers two partitions in a row: one holds both of b's
        holder = wait_for(lambda: next((name for name, port in ports.items() if assigned(port) == {2, 3}), None),
                          60, "a consumer holding both of cell b's partitions")
        other = next(name for name in consumers if name != holder)
        wait_for(lambda: assigned(ports[other]) == {0, 1}, 30, "the other holding cell a's")
        for proxy in proxies.values():
            proxy.freeze()
        ids = send_far(broker, topics)
        wanted = split_ab(ids)
        assert wanted["a"] and wanted["b"]
        wait_for(lambda: ids_in(two_cells["a"]) == wanted["a"], 30, "cell a's messages written while b hangs")
        processes.wait_for_log(consumers[holder], "cell b has not answered for the hold time, and no other consumer "
                                                  "of group")
        proxies[other].thaw()
        processes.wait_for_log(consumers[holder], "left consumer group")
        assert "reached cell b" in processes.log_of(consumers[holder])
        wait_for(lambda: ids_in(two_cells["b"]) == wanted["b"], 30, "cell b's messages written by the other consumer")
        assert "left consumer group" not in processes.log_of(consumers[other])
        proxies[holder].thaw()
        processes.wait_for_log(consumers[holder], "rejoining consumer group")
    finally:
        for proxy in proxies.values():
            proxy.close()
