"""`chronos schedules`: the recurring (cron) schedules and their next occurrence, in every cell."""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config


def add_parser(sub: Any) -> None:
    p = sub.add_parser("schedules", help="list recurring (cron) schedules and their next occurrence",
                       description="The recurring (cron) schedules by next occurrence; with cells, those of every "
                                   "cell, each with its cell.")
    config.add_arguments(p, only=("database_url", "cells", "database_pool_mode"))
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List recurring schedules with their next occurrence."""
    import orjson

    from chronos.commands._shared import operator_stores
    from chronos.domain import cron
    from chronos.ops.inspect import schedules_in_cells
    settings, stores = operator_stores(args)
    try:
        found = schedules_in_cells(stores)
    finally:
        for store in stores.values():
            store.close()
    schedules: list[dict[str, Any]] = [{"id": s.id, "cron": s.cron, "timezone": s.timezone,
                                        "next_occurrence": cron.from_us(s.next_us).isoformat(timespec="milliseconds"),
                                        "topic": s.topic, "ordering_key": s.ordering_key,
                                        "created_at": s.created_at.isoformat(timespec="seconds"),
                                        **({"cell": cell} if settings.cells else {})} for cell, s in found]
    if args.json:
        print(orjson.dumps(schedules, option=orjson.OPT_INDENT_2).decode())
        return 0
    if not schedules:
        print("no recurring schedules")
        return 0
    width = max(len(s["id"]) for s in schedules)
    cells = max((len(s["cell"]) for s in schedules), default=0) if settings.cells else 0
    print(f"{'ID':<{width}}  " + (f"{'CELL':<{max(cells, 4)}}  " if cells else "")
          + f"{'CRON':<16} {'TIME ZONE':<20} NEXT OCCURRENCE (UTC)")
    for s in schedules:
        print(f"{s['id']:<{width}}  " + (f"{s['cell']:<{max(cells, 4)}}  " if cells else "")
              + f"{s['cron']:<16} {s['timezone']:<20} {s['next_occurrence']}")
    return 0
