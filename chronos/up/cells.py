"""The cells of `chronos up --cells N`: their names, an embedded PostgreSQL each under the data directory, and the
map of the input partitions among them, assigned on the first start."""

from __future__ import annotations

from pathlib import Path

from chronos.adapters.postgres.store import Store
from chronos.domain.cells import CellMap, ranges
from chronos.embedded.postgres import EmbeddedPostgres
from chronos.errors import StackError
from chronos.ops.cells import assign_map


def cell_names(count: int) -> list[str]:
    """The names of the cells of `chronos up --cells N`."""
    return [f"cell{i}" for i in range(1, count + 1)]


def pgdata_dir(data_dir: Path, index: int) -> Path:
    """Where the embedded PostgreSQL of the cell at `index` (from 0) keeps its data: the first cell's is the
    stack's one server's, so a stack of one cell keeps its data when it is given more."""
    return data_dir / ("pgdata" if index == 0 else f"pgdata-cell{index + 1}")


def check_data(data_dir: Path, count: int) -> None:
    """A StackError when the data directory holds the data of more cells than `count` (1: a stack without
    cells): the partitions of the ones left out would be served by no one."""
    if pgdata_dir(data_dir, count).exists():
        held = count + 1
        while pgdata_dir(data_dir, held).exists():
            held += 1
        raise StackError(f"the data directory {data_dir} holds the data of {held} cells; run chronos up --cells {held}, "
                         f"or give another --data-dir")


def start_servers(data_dir: Path, log_dir: Path, count: int, first_port: int | None,
                  death_signal: int) -> dict[str, EmbeddedPostgres]:
    """An embedded PostgreSQL per cell, started (on `first_port` and the ports after it, else free ones):
    each cell's server by name."""
    check_data(data_dir, count)
    servers: dict[str, EmbeddedPostgres] = {}
    for index, cell in enumerate(cell_names(count)):
        server = EmbeddedPostgres(pgdata_dir(data_dir, index), log_path=log_dir / f"postgres-{cell}.log",
                                  port=first_port + index if first_port else None, die_with_parent=death_signal)
        servers[cell] = server
        server.start()
        print(f"cell {cell}: started embedded PostgreSQL on port {server.port} (data in {pgdata_dir(data_dir, index)})",
              flush=True)
    return servers


def assign(cells: tuple[tuple[str, str], ...], pool_mode: str, input_topic: str, partitions: int,
           asked: bool) -> CellMap:
    """The cells' map of the input partitions, assigned among them (`partitions` of them) when none is; one
    assigned already stands, and `partitions` (what --partitions asked for, when `asked`) must then be its
    count (CellMapError)."""
    stores = {cell: Store(url, pool_mode=pool_mode) for cell, url in cells}
    try:
        cell_map, assigned = assign_map(stores, partitions)
    finally:
        for store in stores.values():
            store.close()
    if asked:
        cell_map.check_topic(input_topic, partitions)
    print(("assigned" if assigned else "cells own") + " the input partitions: "
          + ", ".join(f"{cell} {ranges(cell_map.partitions_of(cell))}" for cell in cell_map.cells), flush=True)
    return cell_map
