"""`chronos show`: one message or schedule, everything the store holds about it."""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config
from chronos.commands import _shared


def add_parser(sub: Any) -> None:
    p = sub.add_parser("show", help="one message or schedule: state, deadline, topic, key, headers, value",
                       description="Print everything the store holds about one id. Exit 1 when it is not there.")
    config.add_arguments(p, only=_shared.OPERATOR_SETTINGS)
    p.add_argument("id", help="the message or schedule id")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """One message or schedule, everything the store knows; exit 1 when it is not there."""
    from chronos.ops import inspect
    settings, stores = _shared.operator_stores(args)
    try:
        found = inspect.show_in_cells(stores, args.id, output_topic=settings.output_topic)
    finally:
        for store in stores.values():
            store.close()
    cell, m = found[0] if found else ("", None)
    also = [other for other, _ in found[1:]]
    if args.json:
        shown = inspect.to_json(m)
        if settings.cells and m is not None:
            shown.update(cell=cell, also_in=also)
        _shared.print_json(shown)
    elif m is None:
        print(f"{args.id!r}: not_found")
    else:
        lines = [("id", repr(m.id)), ("state", m.state)]
        if cell:
            lines.append(("cell", cell + (f" (also in {', '.join(also)})" if also else "")))
        lines += inspect.schedule_facts(m)
        lines += [("topic", m.topic), ("key", inspect.safe_text(m.key)),
                  ("value", "null" if m.value_size is None else
                   f"{m.value_size:,} bytes {inspect.safe_text(m.value_preview)}"
                   + ("..." if m.value_size > inspect.PREVIEW_BYTES else "")),
                  ("ordering key", repr(m.ordering_key) if m.ordering_key is not None else "-"),
                  ("enqueued", inspect.iso(m.enqueued_at))]
        if m.attempts:
            lines.append(("failed publishes", f"{m.attempts}, last: {m.last_error}"))
        if m.original_deadline is not None:
            lines.append(("scheduled for", inspect.iso(m.original_deadline)))
        lines.append(("headers", str(len(m.headers)) if m.headers else "none"))
        lines += [(f"  {k!r}", inspect.safe_text(v)) for k, v in m.headers]
        print("\n".join(f"{label:<16} {value}" for label, value in lines))
    return 0 if m is not None else 1
