"""`chronos up --cells N` as a newcomer runs it: an embedded PostgreSQL per cell, the input partitions assigned
among them, the input topic created with room for them, the firers and detectors of every cell, and a ready
file that names each cell; `chronos send` and `tail` through it, and `status`, `list`, `show` and `cancel`
asking every cell; started again, the same cells and map; with fewer cells than its data directory holds,
refused."""

from __future__ import annotations

import re
import subprocess
import urllib.request

import orjson
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from chronos.adapters.kafka.admin import partition_count
from chronos.adapters.postgres.store import Store
from chronos.domain.cells import CellPartition
from chronos.domain.routing import input_partition
from helpers import exited
from kits.stack import CHRONOS, ChronosUp, clean_env


def chronos(info_file, *args: str) -> str:
    out = subprocess.run(CHRONOS + [*args, "--ready-file", str(info_file)], env=clean_env(), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def ids_in(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM chronos_messages")}


def test_up_with_two_cells_send_tail_status_list_show_cancel_and_start_again(tmp_path):
    up = ChronosUp("--cells", "2", workdir=tmp_path)
    try:
        info = up.start()
        cells = info["cells"]
        assert list(cells) == ["cell1", "cell2"] and info["database_url"] is None
        assert info["console_url"] and "console not started" not in up.output()
        assert "assigned the input partitions: cell1 0-3, cell2 4-7" in up.output()
        assert partition_count(info["bootstrap_servers"], info["input_topic"]) == 8
        assert partition_count(info["bootstrap_servers"], info["output_topic"]) == 1
        for cell, share in (("cell1", range(4)), ("cell2", range(4, 8))):
            store = Store(cells[cell])
            assert store.cell_partitions() == [CellPartition(p, 1) for p in share]
            store.close()
        # the firers and detectors of each cell (one each, as asked, per cell), one consumer for all
        assert sorted(up.programs()) == ["consumer_00", "detector_00", "detector_01", "firer_00", "firer_01"]
        for name in up.programs():
            up.wait_running(name)  # and logged its start
        assert "(cell cell2)" in up.log("firer_01") and "(cell cell1)" in up.log("detector_00")
        # messages routed to both cells wait in their cell, and the due ones are fired by their cell's firer
        far = [chronos(up.ready_file, "send", "--delay", "1h", "--id", f"far-{i}") for i in range(8)]
        by_cell = {cell: {m for m in far if (input_partition(m, None, 8) < 4) == (cell == "cell1")} for cell in cells}
        assert by_cell["cell1"] and by_cell["cell2"]
        for i in range(6):
            chronos(up.ready_file, "send", "--delay", "1s", "--id", f"soon-{i}", "--value", f"soon-{i}")
        tailed = chronos(up.ready_file, "tail", "--count", "6", "--from-beginning", "--timeout", "30")
        assert sorted(re.findall(r"value='(soon-\d)'", tailed)) == [f"soon-{i}" for i in range(6)]
        assert {cell: ids_in(url) for cell, url in cells.items()} == by_cell
        # the operators' commands ask every cell and say which cell each message is in
        status = orjson.loads(chronos(up.ready_file, "status", "--json"))
        assert status["waiting"] == 8
        assert [(c["cell"], c["waiting"], c["input_partitions"]) for c in status["cells"]] == [
            ("cell1", len(by_cell["cell1"]), [0, 1, 2, 3]), ("cell2", len(by_cell["cell2"]), [4, 5, 6, 7])]
        listed = chronos(up.ready_file, "list")
        assert {(m, c) for m, c in re.findall(r"'(far-\d)'  cell=(cell\d)", listed)} == \
            {(m, cell) for cell, ms in by_cell.items() for m in ms}
        one, other = sorted(by_cell["cell1"])[0], sorted(by_cell["cell2"])[0]
        assert re.search(r"^cell +cell2$", chronos(up.ready_file, "show", other), re.M)
        cancelled = chronos(up.ready_file, "cancel", one, other)
        assert cancelled.startswith(f"2 cancelled (cell1 1, cell2 1): {one!r} (cell cell1), {other!r} (cell cell2)")
        by_cell = {"cell1": by_cell["cell1"] - {one}, "cell2": by_cell["cell2"] - {other}}
        assert {cell: ids_in(url) for cell, url in cells.items()} == by_cell
        # every process's health and metrics name the cell it serves; the consumer checks each cell
        health = [orjson.loads(line) for line in chronos(up.ready_file, "health").splitlines()]
        assert sorted((h["role"], h.get("cell")) for h in health) == [
            ("consumer", None), ("detector", "cell1"), ("detector", "cell2"), ("firer", "cell1"), ("firer", "cell2")]
        (consumer,) = [h for h in health if h["role"] == "consumer"]
        assert {"postgres of cell cell1", "postgres of cell cell2"} <= set(consumer["checks"])
        labelled = set()
        for url in info["metrics_urls"]:
            with urllib.request.urlopen(url, timeout=5) as scraped:
                for family in text_string_to_metric_families(scraped.read().decode()):
                    labelled |= {(s.labels["role"], s.labels.get("cell")) for s in family.samples
                                 if s.name == "chronos_healthy"}
        assert labelled == {("consumer", None), ("firer", "cell1"), ("firer", "cell2"), ("detector", "cell1"),
                            ("detector", "cell2")}
        pids = [info["supervisord_pid"], info["broker_pid"], *info["cell_postgres_pids"].values(), *up.program_pids()]
        assert up.halt()
        assert all(exited(pid) for pid in pids), up.output()
        # fewer cells than the data directory holds: the partitions of the others would be served by no one
        fewer = ChronosUp("--cells", "1", workdir=tmp_path).launch()
        assert fewer.proc is not None and fewer.proc.wait(60) == 5
        assert "holds the data of 2 cells; run chronos up --cells 2" in fewer.output()
        # started again: the same cells, their map as it was, their messages waiting
        info = up.start()
        assert "cells own the input partitions: cell1 0-3, cell2 4-7" in up.output()
        assert {cell: ids_in(url) for cell, url in info["cells"].items()} == by_cell
    finally:
        up.stop()


def test_up_on_cells_of_postgresql_servers_of_ones_own(tmp_path, two_cells):
    """`chronos up --cells NAME=URL ...` runs on the cells given, as on --database-url: each waited for and
    migrated, the input partitions assigned among them on the first start, the firers and detectors of each,
    and the ready file naming them; --cells N beside CHRONOS_CELLS is refused in one line."""
    given = " ".join(f"{cell}={url}" for cell, url in two_cells.items())
    both = ChronosUp("--cells", "2", workdir=tmp_path / "both", env={"CHRONOS_CELLS": given}).launch()
    assert both.proc is not None and both.proc.wait(60) == 2
    assert "--cells 2 runs embedded cells, and CHRONOS_CELLS names cells of your own: give one or the other" \
        in both.output()
    up = ChronosUp("--cells", given, "--no-console", workdir=tmp_path / "own")
    try:
        info = up.start()
        assert info["cells"] == two_cells and info["cell_postgres_pids"] is None and info["postgres_pid"] is None
        out = up.output()
        assert "cell a: using PostgreSQL at" in out and "cell b: using PostgreSQL at" in out
        assert "assigned the input partitions: a 0-3, b 4-7" in out
        assert sorted(up.programs()) == ["consumer_00", "detector_00", "detector_01", "firer_00", "firer_01"]
        # messages of both cells, each fired by its cell's firer
        ids = [f"own-{i}" for i in range(6)]
        assert {input_partition(m, None, 8) < 4 for m in ids} == {True, False}
        for m in ids:
            chronos(up.ready_file, "send", "--delay", "1s", "--id", m, "--value", m)
        tailed = chronos(up.ready_file, "tail", "--count", "6", "--from-beginning", "--timeout", "30")
        assert sorted(re.findall(r"value='(own-\d)'", tailed)) == ids
    finally:
        up.stop()
