"""`chronos schedules`: the recurring (cron) schedules and their next occurrence."""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config


def add_parser(sub: Any) -> None:
    p = sub.add_parser("schedules", help="list recurring (cron) schedules and their next occurrence")
    config.add_arguments(p, only=("database_url", "database_pool_mode"))
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List recurring schedules with their next occurrence."""
    import orjson

    from chronos.domain import cron
    from chronos.adapters.postgres.store import Store
    settings = config.load(args)
    store = Store(settings.require_database(), pool_mode=settings.database_pool_mode)
    rows = store.list_schedules()
    store.close()
    schedules: list[dict[str, Any]] = [{"id": sid, "cron": expr, "timezone": tz,
                  "next_occurrence": cron.from_us(next_us).isoformat(timespec="milliseconds"),
                  "topic": topic, "ordering_key": okey, "created_at": created.isoformat(timespec="seconds")}
                 for sid, expr, tz, next_us, topic, okey, created in rows]
    if args.json:
        print(orjson.dumps(schedules, option=orjson.OPT_INDENT_2).decode())
        return 0
    if not schedules:
        print("no recurring schedules")
        return 0
    width = max(len(s["id"]) for s in schedules)
    print(f"{'ID':<{width}}  {'CRON':<16} {'TIME ZONE':<20} NEXT OCCURRENCE (UTC)")
    for s in schedules:
        print(f"{s['id']:<{width}}  {s['cron']:<16} {s['timezone']:<20} {s['next_occurrence']}")
    return 0
