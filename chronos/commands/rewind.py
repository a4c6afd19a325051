"""`chronos rewind`: move the consumer group on the input topic back to a moment, after a restore
(chronos/ops/rewind.py does it)."""

from __future__ import annotations

import argparse
from datetime import timezone
from typing import Any

from chronos import config
from chronos.domain.cells import CellMap
from chronos.ops.rewind import ASSIGN_WAIT_S, parse_moment, rewind


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rewind", help="move the consumer group on the input topic back to a moment (after a "
                                      "restore; Chronos's consumers stopped)",
                       description="Join the consumer group as its only member, commit on every partition of "
                                   "the input topic the first offset at or after --to, and leave: after a "
                                   "restore, the consumers read again what arrived since the backup. Uses the "
                                   "processes' Kafka settings (CHRONOS_KAFKA_PROPERTIES_FILE included). Commits "
                                   "nothing unless it gets every partition (a consumer still running keeps "
                                   "some). With cells it names the cell of each partition, and --cell moves only "
                                   "the partitions of the cell restored.")
    config.add_arguments(p, only=("kafka_bootstrap_servers", "input_topic", "consumer_group", "kafka_properties",
                                  "kafka_properties_file", "cells", "database_pool_mode"))
    p.add_argument("--to", required=True, metavar="TIME",
                   help="the moment, ISO-8601 with its zone: 2026-11-26T06:14:13Z or ...+01:00 (no zone is refused)")
    p.add_argument("--cell", action="append", default=None, metavar="NAME", dest="restored",
                   help="with cells: move only the partitions this cell owns (the cell restored; again for more), "
                        "leaving the others' offsets as they are")
    p.add_argument("--dry-run", action="store_true", help="print the offsets, commit nothing")
    p.add_argument("--wait", type=float, default=ASSIGN_WAIT_S, metavar="SECONDS",
                   help=f"how long to wait for every partition (default {ASSIGN_WAIT_S:.0f})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    moment = parse_moment(args.to)
    settings = config.load(args)
    cell_map = read_cells(settings, args.restored)
    only = None
    if args.restored and cell_map is not None and cell_map.owners:
        only = {p for p, owner in cell_map.owners.items() if owner.cell in args.restored}
    moved = rewind(settings, moment, dry_run=args.dry_run, assign_wait=args.wait, only=only)
    verb = "would move" if args.dry_run else "moved"
    print(f"group {settings.consumer_group} on {settings.input_topic} {verb} to "
          f"{moment.astimezone(timezone.utc).isoformat().replace('+00:00', 'Z')}"
          + (f" on the partitions of cell{'s' if len(args.restored) > 1 else ''} {', '.join(args.restored)}" if args.restored
             else "") + ":")
    for m in moved:
        cell = f" (cell {cell_map.owner(m.partition).cell})" if cell_map is not None else ""
        print(f"  partition {m.partition}{cell}: {'-' if m.was < 0 else m.was} -> {m.now}")
    return 0


def read_cells(settings: config.Settings, chosen: list[str] | None) -> CellMap | None:
    """With cells, the map the cells hold (each partition's cell); without, None (and --cell refused)."""
    if not settings.cells:
        if chosen:
            raise config.ConfigError("--cell names a cell of CHRONOS_CELLS, and no cells are set")
        return None
    unknown = [cell for cell in chosen or () if cell not in dict(settings.cells)]
    if unknown:
        raise config.ConfigError(f"--cell {unknown[0]}: CHRONOS_CELLS lists {', '.join(c for c, _ in settings.cells)}")
    from chronos.adapters.postgres.store import Store
    from chronos.ops.cells import read_map
    stores = {cell: Store(url, pool_mode=settings.database_pool_mode, application_name="chronos rewind")
              for cell, url in settings.cells}
    try:
        return read_map(stores)
    finally:
        for store in stores.values():
            store.close()
