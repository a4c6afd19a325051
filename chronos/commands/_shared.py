"""What several commands share: a role's process command (`consumer`, `firer`, `detector`), the operators'
store, filters and actions (`show`, `list`, `cancel`, `fire-now`, `reschedule`), JSON output, and the
header `send` stamps and `tail` reads. No command of its own: a module of this package whose name starts
with an underscore is never a command."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from chronos import config

#: relayed untouched (not a Chronos header), so that `chronos tail` can print the lateness of what
#: `chronos send` sent
DEADLINE_ECHO_HEADER = "x-deadline-ms"

Handler = Callable[[argparse.Namespace], int]


def print_json(data: Any) -> None:
    import orjson
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


# -- the three processes ---------------------------------------------------------------------

def add_role_parser(sub: Any, role: str, text: str, handler: Handler) -> None:
    """A role's command: every setting, no flag of its own."""
    p = sub.add_parser(role, help=text, description=text)
    config.add_arguments(p)
    p.set_defaults(func=handler)


def run_role(role: str, args: argparse.Namespace) -> int:
    """Run this process as `role` (consumer, firer or detector) until it stops; its exit code."""
    from chronos import processes
    settings = config.load(args)
    # a firer or a detector serves one cell; a consumer, every cell
    return processes.main(role, settings if role == "consumer" else serving_cell(settings))


def serving_cell(settings: config.Settings, environ: Mapping[str, str] | None = None) -> config.Settings:
    """The settings of a firer or detector: with cells, those of the one cell it serves (its database URL and
    name), CHRONOS_CELL's, else under supervisord the cell at its process number modulo their count, else the
    first; without cells, the settings as they are."""
    if not settings.cells:
        return settings
    environ = os.environ if environ is None else environ
    cell = settings.cell
    if cell is None:
        num = environ.get("CHRONOS_PROCESS_NUM") or "0"
        if not num.isdigit():
            raise config.ConfigError(f"CHRONOS_PROCESS_NUM must be a whole number, got {num!r}")
        cell = settings.cells[int(num) % len(settings.cells)][0]
    return config.replace(settings, cell=cell, database_url=dict(settings.cells)[cell])


# -- the operators' commands: show, list, cancel, fire-now, reschedule (chronos/ops/inspect.py does the work) --

OPERATOR_SETTINGS = ("database_url", "cells", "database_pool_mode", "output_topic")
FILTER_FLAGS = ("due_before", "due_after", "topic", "key", "ordering_key", "id_prefix", "state")


def operator_stores(args: argparse.Namespace):
    """The settings, and a store on each cell's database by cell name (CHRONOS_CELLS; without cells, one on
    CHRONOS_DATABASE_URL, named "")."""
    from chronos.adapters.postgres.store import Store
    settings = config.load(args)
    return settings, {cell: Store(url, pool_mode=settings.database_pool_mode)
                      for cell, url in settings.databases().items()}


def in_cell(where: dict[str, str], message_id: str) -> str:
    """` (cell NAME)` after an id, with cells; nothing without."""
    return f" (cell {where[message_id]})" if message_id in where else ""


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filters")
    g.add_argument("--due-before", default=None, metavar="TIME", help="deadline before TIME: ISO-8601, or "
                   "relative to now like 10m, -2h, 1d")
    g.add_argument("--due-after", default=None, metavar="TIME", help="deadline after TIME")
    g.add_argument("--topic", default=None, help="destination topic")
    g.add_argument("--key", default=None, help="message key: UTF-8 text, or hex:0a1b...")
    g.add_argument("--ordering-key", default=None, help="ordering key (chronosOrderingKey)")
    g.add_argument("--id-prefix", default=None, help="ids starting with this (lists in id order)")
    g.add_argument("--state", default=None, help="waiting, in_flight or recurring")


def filters(args: argparse.Namespace, settings: config.Settings, now: datetime):
    """The filters given by the flags of `add_filter_arguments`."""
    from chronos.ops import inspect
    return inspect.filters_for(
        output_topic=settings.output_topic,
        due_after=inspect.parse_time(args.due_after, now, "--due-after") if args.due_after else None,
        due_before=inspect.parse_time(args.due_before, now, "--due-before") if args.due_before else None,
        topic=args.topic, key=inspect.parse_key(args.key), ordering_key=args.ordering_key,
        id_prefix=args.id_prefix, state=args.state)


def note_key_search(stores: Mapping[str, Any], f: Any) -> None:
    """On standard error, where a search by key (`f`: the filters) reads the rows in deadline order, there being
    no key-search index (`chronos key-search`)."""
    from chronos.ops import inspect
    note = inspect.key_search_note(inspect.without_key_search(stores, f))
    if note:
        print(f"note: {note}", file=sys.stderr)


def add_action_parser(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    """The parser of an action on waiting messages (cancel, fire-now, reschedule), up to its own flags;
    `finish_action_parser` adds the flags every action ends with."""
    p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}, by id or by --filter. "
                       "Messages a firer holds (in flight) are left alone and reported (exit 8); unknown ids "
                       "exit 6; more than CHRONOS_CONFIRM_ABOVE messages need --yes (exit 7 without).")
    config.add_arguments(p, only=OPERATOR_SETTINGS + ("confirm_above", "log_level", "log_format"))
    p.add_argument("ids", nargs="*", metavar="ID", help="ids of the messages or schedules (or --filter)")
    p.add_argument("--filter", action="store_true", help="act on every message matching the filters")
    add_filter_arguments(p)
    return p


def finish_action_parser(p: argparse.ArgumentParser, handler: Handler) -> None:
    p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    p.add_argument("--yes", action="store_true", help="act even on more than CHRONOS_CONFIRM_ABOVE messages")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=handler)


_DONE = {"cancel": "cancelled", "fire_now": "made due now", "reschedule": "rescheduled"}


def run_action(command: str, args: argparse.Namespace) -> int:
    """cancel, fire-now, reschedule: by ids or by --filter; --dry-run; --yes above the threshold."""
    from chronos import logs
    from chronos.ops import inspect
    action = command.replace("-", "_")
    settings, stores = operator_stores(args)
    logs.setup("operator", str(uuid.uuid4()), settings.log_level, settings.log_format, settings.secrets())
    now = datetime.now(timezone.utc)
    f = filters(args, settings, now) if args.filter else None
    if f is None and any(getattr(args, a) is not None for a in FILTER_FLAGS):
        raise config.ConfigError("filters act only with --filter (so a typo never widens an action)")
    if f is not None and args.ids:
        raise config.ConfigError("give message ids, or --filter with filters, not both")
    if f is None and not args.ids:
        raise config.ConfigError(f"give the ids of the messages to {command}, or --filter with filters")
    at = None
    if action == "reschedule":
        if (args.at is None) == (args.delay is None):
            raise config.ConfigError("reschedule needs one of --at or --delay")
        at = inspect.parse_time(args.at, now, "--at") if args.at else now + inspect.parse_delay(args.delay)
    try:
        note_key_search(stores, f)
        result = inspect.act_in_cells(stores, action, ids=args.ids, filters=f, output_topic=settings.output_topic,
                                      at=at, dry_run=args.dry_run, confirm_above=settings.confirm_above, yes=args.yes)
    finally:
        for store in stores.values():
            store.close()
    if args.json:
        print_json(inspect.to_json(result))
    else:
        verb = _DONE[action]
        head = f"would be {verb}" if args.dry_run else verb
        when = f" (to {inspect.iso(result.at)})" if result.at and action == "reschedule" else ""
        cells = f" ({', '.join(f'{cell} {n:,}' for cell, n in result.cells.items())})" if result.cells else ""
        print(f"{result.changed} {head}{when}{cells}"
              + (": " + ", ".join(repr(i) + in_cell(result.where, i) for i in result.sample)
                 + (" ..." if result.changed > len(result.sample) else "") if result.sample else ""))
        if result.in_flight:
            print(f"{len(result.in_flight)} in flight (a firer is publishing them), left alone: "
                  + ", ".join(repr(i) + in_cell(result.where, i) for i in result.in_flight[:inspect.SAMPLE]))
        if result.not_found:
            print(f"{len(result.not_found)} not found: " + ", ".join(repr(i) for i in result.not_found[:inspect.SAMPLE]))
    result.check()
    return 0
