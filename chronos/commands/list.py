"""`chronos list`: search what waits (waiting, in-flight and recurring messages), a page at a time."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any

from chronos import config
from chronos.commands import _shared


def add_parser(sub: Any) -> None:
    p = sub.add_parser("list", help="search waiting, in-flight and recurring messages, a page at a time",
                       description="Messages matching every filter given, in deadline order (id order with "
                                   "--id-prefix); each page prints the cursor of the next.")
    # the hold time bounds where rows held by a firer's claim that deletes are looked for (in flight)
    config.add_arguments(p, only=_shared.OPERATOR_SETTINGS + ("hold_time_ms",))
    _shared.add_filter_arguments(p)
    p.add_argument("--limit", default="50", help="messages per page (default 50)")
    p.add_argument("--after", default=None, metavar="CURSOR", help="the cursor printed with the previous page")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """A page of waiting, in-flight and recurring messages matching the filters, with the next cursor."""
    from chronos.ops import inspect
    settings, stores = _shared.operator_stores(args)
    try:
        limit = config._positive_int("--limit", args.limit)
        f = _shared.filters(args, settings, datetime.now(timezone.utc))
        _shared.note_key_search(stores, f)
        page = inspect.list_in_cells(stores, f, output_topic=settings.output_topic, limit=limit, after=args.after,
                                     held_within_ms=settings.hold_time_ms // 2)
    finally:
        for store in stores.values():
            store.close()
    if args.json:
        _shared.print_json(inspect.to_json(page))
        return 0
    for m, cell in zip(page.items, page.cells or [""] * len(page.items)):
        print(f"{inspect.iso(m.deadline)}  {m.state:<9}  {m.id!r}" + (f"  cell={cell}" if cell else "")
              + f"  topic={m.topic} key={inspect.safe_text(m.key, 32)}"
              + (f" ordering_key={m.ordering_key!r}" if m.ordering_key is not None else "")
              + (f" cron={m.cron!r}" if m.cron else "") + (f" firer={m.firer}" if m.firer else ""))
    if not page.items:
        print("no messages match")
    if page.cursor:
        print(f"next page: --after {page.cursor}")
    return 0
