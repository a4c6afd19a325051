"""`chronos migrate`: create or upgrade the database schema, of every cell."""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config
from chronos.errors import ChronosError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("migrate", help="create or upgrade the database schema (idempotent)",
                       description="Create or upgrade the schema of the database, or with cells of every cell's, in "
                                   "their order. A cell that cannot be migrated (it does not answer, say) is named "
                                   "and the others are migrated all the same; the command then exits with that "
                                   "cell's error, and run again it migrates what is left (a cell already at the "
                                   "latest version is left as it is). With cells, the first migration also "
                                   "assigns the input partitions among the cells (--partitions).")
    config.add_arguments(p, only=("database_url", "cells", "database_pool_mode", "log_level"))
    p.add_argument("--partitions", type=int, default=None, metavar="N",
                   help="with cells that list no input partition yet: the input topic's partition count, assigned "
                        "among them (contiguous runs, as even as they go); once assigned, checked against the map")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = config.load(args)
    failed: list[tuple[str, ChronosError]] = []
    for cell, url in settings.databases().items():
        try:
            migrate(url, settings.database_pool_mode, f"cell {cell}: " if cell else "")
        except ChronosError as exc:
            if not cell:
                raise
            print(f"cell {cell}: not migrated: {exc}")
            failed.append((cell, exc))
    if failed:
        first = failed[0][1]
        left = ", ".join(cell for cell, _ in failed)
        error = type(first)(f"{len(failed)} of {len(settings.cells)} cells not migrated ({left}): run chronos migrate "
                            "again once they answer; the cells migrated are left as they are")
        raise error
    if settings.cells:
        assign(settings, args.partitions)
    elif args.partitions is not None:
        raise config.ConfigError("--partitions assigns the input partitions among cells: give CHRONOS_CELLS")
    return 0


def assign(settings: config.Settings, partitions: int | None) -> None:
    """The cells' map: assigned among them on the first migration (`chronos.ops.cells.first_map`), and said."""
    from chronos.adapters.postgres.store import Store
    from chronos.domain.cells import ranges
    from chronos.ops.cells import first_map
    if partitions is not None and partitions < 1:
        raise config.ConfigError(f"--partitions must be at least 1, got {partitions}")
    stores = {cell: Store(url, pool_mode=settings.database_pool_mode, application_name="chronos migrate")
              for cell, url in settings.cells}
    try:
        cell_map, given = first_map(stores, partitions)
    finally:
        for store in stores.values():
            store.close()
    owned = ", ".join(f"{cell} {ranges(cell_map.partitions_of(cell)) or 'none'}" for cell in cell_map.cells)
    if len(cell_map.cells) == 1:
        print(f"cell {cell_map.cells[0]} owns every input partition")
    elif given:
        print(f"assigned the input partitions: {owned}")
    else:
        print(f"cells own the input partitions: {owned}")


def migrate(url: str, pool_mode: str, prefix: str) -> None:
    """Migrate one database, saying how (`prefix` names its cell)."""
    from chronos.adapters.postgres import migrations, pooling
    # a pool mode the processes would fail with is found here, before they start
    if pooling.resolve_pool_mode(url, pool_mode, check=True) == pooling.TRANSACTION:
        print(f"{prefix}PostgreSQL is reached through a pooler in transaction mode: the processes prepare no "
              "statement and make their settings in each transaction")
    applied = migrations.migrate(url)
    if applied:
        print(f"{prefix}applied migrations {', '.join(map(str, applied))}; schema at version {migrations.LATEST_VERSION}")
    else:
        print(f"{prefix}schema already at version {migrations.LATEST_VERSION}")
