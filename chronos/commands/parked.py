"""`chronos parked list|show|replay|drop`: the messages no topic took (neither their destination nor the
dead-letter topic), kept in PostgreSQL: see them, publish them again, or delete them
(chronos/ops/parked.py does the work)."""

from __future__ import annotations

import argparse
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from chronos import config
from chronos.commands import _shared

STORE_SETTINGS = ("database_url", "cells", "database_pool_mode")
ACTED = "Selects by number (as `chronos parked list` shows them: with cells CELL#NUMBER) or, with --filter, every " \
        "parked message matching the filters, oldest first (with cells, in every cell); numbers not parked exit 6; " \
        "more than CHRONOS_CONFIRM_ABOVE (in all the cells) need --yes (exit 7 without)."


def add_parser(sub: Any) -> None:
    """The `parked` command and its four: list, show, replay, drop."""
    parser = sub.add_parser("parked", help="the messages no topic took, kept in PostgreSQL: list, show, replay "
                                           "or drop them",
                            description="Messages that neither their destination nor the dead-letter topic took "
                                        "(too large for both, say) are parked in PostgreSQL (chronos_parked) and "
                                        "never published again by themselves: list and show them, replay them "
                                        "to Kafka once the cause is fixed, or drop them. With cells (CHRONOS_CELLS) "
                                        "each cell parks its own and numbers them itself: CELL#NUMBER names one.")
    sub = parser.add_subparsers(dest="parked_command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="parked messages, newest first, a page at a time",
                       description="Parked messages matching every filter given, newest first (with cells, those "
                                   "of every cell, each named CELL#NUMBER); each page prints the cursor of the next.")
    config.add_arguments(p, only=STORE_SETTINGS)
    _add_filters(p)
    p.add_argument("--limit", default="50", help="parked messages per page (default 50)")
    p.add_argument("--before", default=None, metavar="CURSOR", help="the cursor printed with the previous page")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run_list)

    p = sub.add_parser("show", help="one parked message: where it was going, why it was parked, key, headers, "
                                    "value", description="Print everything PostgreSQL keeps of one parked message. "
                                                         "Exit 1 when it is not there.")
    config.add_arguments(p, only=STORE_SETTINGS)
    p.add_argument("number", help="its number, as `chronos parked list` shows it (with cells, CELL#NUMBER)")
    p.add_argument("--save-value", default=None, metavar="PATH",
                   help="write its whole value to PATH (to publish it in another shape, say)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run_show)

    p = _add_action(sub, "replay", "publish parked messages again: key, value and headers byte for byte, each to "
                                   "the topic it was going to or to --to",
                    "A parked message is deleted once Kafka acknowledged its publish (a crash in between publishes "
                    "it again on the next replay: at least once); one Kafka refuses stays parked with the refusal "
                    "as its reason (exit 9), as does one whose topic is neither the output topic, the dead-letter "
                    "topic nor one CHRONOS_ALLOWED_TOPICS allows; one Kafka does not answer within --timeout stays "
                    "as it was and the replay stops (exit 3).",
                    ("output_topic", "dlq_topic", "allowed_topics", "kafka_bootstrap_servers", "kafka_properties",
                     "kafka_properties_file"))
    p.add_argument("--to", default=None, metavar="TOPIC",
                   help="publish them all to TOPIC: the output topic, the dead-letter topic, or a topic "
                        "CHRONOS_ALLOWED_TOPICS allows (default: each to the topic it was going to)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for Kafka to answer (10 at most) and acknowledge each batch (default 30)")
    _finish_action(p, run_replay)

    p = _add_action(sub, "drop", "delete parked messages for good", "", ())
    _finish_action(p, run_drop)


def _add_filters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filters")
    g.add_argument("--topic", default=None, help="the topic it was going to")
    g.add_argument("--reason", default=None, metavar="CODE",
                   help="why it was parked: the code its reason starts with, such as too_large or publish_failed")
    g.add_argument("--parked-after", default=None, metavar="TIME",
                   help="parked after TIME: ISO-8601, or relative to now (--parked-after=-2h)")
    g.add_argument("--parked-before", default=None, metavar="TIME", help="parked before TIME")
    g.add_argument("--id-prefix", default=None, help="message ids starting with this")


_FILTERS = ("topic", "reason", "parked_after", "parked_before", "id_prefix")


def _add_action(sub: Any, name: str, text: str, more: str, settings: tuple[str, ...]) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}. {ACTED}" + (f" {more}" if more else ""))
    config.add_arguments(p, only=STORE_SETTINGS + settings + ("confirm_above", "log_level", "log_format"))
    p.add_argument("numbers", nargs="*", metavar="NUMBER", help="numbers of parked messages, as `chronos parked "
                   "list` shows them (with cells CELL#NUMBER), or --filter")
    p.add_argument("--filter", action="store_true", help="act on every parked message matching the filters")
    _add_filters(p)
    return p


def _finish_action(p: argparse.ArgumentParser, handler: _shared.Handler) -> None:
    p.add_argument("--dry-run", action="store_true", help="print what would be done, do nothing")
    p.add_argument("--yes", action="store_true", help="act even on more than CHRONOS_CONFIRM_ABOVE parked messages")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=handler)


def _filters(args: argparse.Namespace):
    from chronos.ops import parked
    return parked.filters_for(datetime.now(timezone.utc), **{f: getattr(args, f) for f in _FILTERS})


def _close(stores: dict[str, Any]) -> None:
    for store in stores.values():
        store.close()


# -- list, show ----------------------------------------------------------------------------------

def run_list(args: argparse.Namespace) -> int:
    """A page of parked messages matching the filters, newest first, with the next cursor."""
    from chronos.ops import inspect, parked
    limit = config._positive_int("--limit", args.limit)
    f = _filters(args)
    settings, stores = _shared.operator_stores(args)
    try:
        page = parked.list_parked_in_cells(stores, limit=limit, before=args.before, filters=f)
    finally:
        _close(stores)
    if args.json:
        _shared.print_json(parked.to_json(page))
        return 0
    for p, cell in zip(page.items, page.cells or [""] * len(page.items)):
        size = "null" if p.value_size is None else f"{p.value_size:,} bytes"
        print(f"{parked.label(cell, p.number)}  {inspect.iso(p.parked_at)}  {_id(p.message_id)}  topic={p.topic} "
              f"value={size}  reason={p.reason}")
    if not page.items:
        print("no parked messages match")
    if page.cursor:
        print(f"next page: --before {page.cursor}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    """One parked message, everything kept of it; exit 1 when it is not there."""
    from chronos.ops import inspect, parked
    settings, stores = _shared.operator_stores(args)
    try:
        ((cell, number),) = parked.parse_refs([args.number], list(stores))
        p = stores[cell].show_parked(number)
        whole = stores[cell].load_parked([number]) if p is not None and args.save_value else []
    finally:
        _close(stores)
    name = parked.label(cell, number)
    if args.json:
        shown = parked.to_json(p)
        if cell and p is not None:
            shown["cell"] = cell
        _shared.print_json(shown)
    elif p is None:
        print(f"{name}: not_found")
    else:
        lines = [("number", name), *([("cell", cell)] if cell else []), ("id", _id(p.message_id)),
                 ("source", p.source), ("topic", p.topic),
                 ("deadline", inspect.iso(p.deadline) if p.deadline else "-"), ("parked", inspect.iso(p.parked_at)),
                 ("reason", p.reason), ("key", inspect.safe_text(p.key)),
                 ("value", "null" if p.value_size is None else
                  f"{p.value_size:,} bytes {inspect.safe_text(p.value_preview)}"
                  + ("..." if p.value_size > inspect.PREVIEW_BYTES else "")),
                 ("headers", str(len(p.headers)) if p.headers else "none")]
        lines += [(f"  {k!r}", inspect.safe_text(v)) for k, v in p.headers]
        print("\n".join(f"{label:<16} {value}" for label, value in lines))
    if whole:
        value = whole[0].value
        if value is None:
            raise config.ConfigError(f"{name} has a null value (a tombstone): nothing to save")
        Path(args.save_value).write_bytes(value)
        if not args.json:
            print(f"value saved to {args.save_value} ({len(value):,} bytes)")
    return 0 if p is not None else 1


def _id(message_id: str | None) -> str:
    return repr(message_id) if message_id is not None else "(no id)"


# -- replay, drop --------------------------------------------------------------------------------

def _selection(args: argparse.Namespace, verb: str, cells: list[str]) -> dict[str, Any]:
    """What an action acts on: its parked messages (each with its cell), or the filters with --filter."""
    from chronos.ops import parked
    if not args.filter and any(getattr(args, f) is not None for f in _FILTERS):
        raise config.ConfigError("filters act only with --filter (so a typo never widens an action)")
    if args.filter and args.numbers:
        raise config.ConfigError("give numbers of parked messages, or --filter with filters, not both")
    if not args.filter and not args.numbers:
        raise config.ConfigError(f"give the numbers of the parked messages to {verb}, or --filter with filters")
    return {"filters": _filters(args)} if args.filter else {"refs": parked.parse_refs(args.numbers, cells)}


def run_replay(args: argparse.Namespace) -> int:
    """Publish parked messages again; delete each once Kafka acknowledged it."""
    if args.timeout <= 0:
        raise config.ConfigError(f"--timeout must be greater than 0, got {args.timeout:g}")
    settings, stores = _shared.operator_stores(args)
    try:
        return _replay(args, settings, stores)
    finally:
        _close(stores)


def _replay(args: argparse.Namespace, settings: config.Settings, stores: dict[str, Any]) -> int:
    from chronos import logs
    from chronos.ops import parked
    selection = _selection(args, "replay", list(stores))
    if not settings.kafka_bootstrap_servers and not args.dry_run:
        raise config.ConfigError("no Kafka to replay to: give --kafka-bootstrap-servers or --ready-file")
    logs.setup("operator", str(uuid.uuid4()), settings.log_level, settings.log_format, settings.secrets())
    destinations = parked.Destinations(settings.output_topic, settings.dlq_topic, settings.allowed_topics_re)

    def producer():
        from chronos.adapters.kafka.admin import check_reachable
        from chronos.adapters.kafka.clients import make_producer
        assert settings.kafka_bootstrap_servers  # checked above: only a dry run goes without
        check_reachable(settings.kafka_bootstrap_servers, settings.kafka_config, timeout=min(10.0, args.timeout),
                        secrets=settings.secrets())
        return make_producer(settings, "replay", **{"message.timeout.ms": str(int(args.timeout * 1000))})[0]

    result = parked.replay_in_cells(stores, producer, destinations, to=args.to, dry_run=args.dry_run,
                                    confirm_above=settings.confirm_above, yes=args.yes, timeout=args.timeout,
                                    **selection)
    _report(args, result, "replayed", f" to {args.to or 'their topics'}")
    return 0


def run_drop(args: argparse.Namespace) -> int:
    """Delete parked messages."""
    from chronos import logs
    from chronos.ops import parked
    settings, stores = _shared.operator_stores(args)
    try:
        selection = _selection(args, "drop", list(stores))
        logs.setup("operator", str(uuid.uuid4()), settings.log_level, settings.log_format, settings.secrets())
        result = parked.drop_in_cells(stores, dry_run=args.dry_run, confirm_above=settings.confirm_above,
                                      yes=args.yes, **selection)
    finally:
        _close(stores)
    _report(args, result, "dropped", "")
    return 0


def _report(args: argparse.Namespace, result: Any, done: str, where: str) -> None:
    """The result, as text or JSON; then the error of an incomplete action."""
    from chronos.ops import parked
    if args.json:
        _shared.print_json(parked.to_json(result))
    else:
        head = f"would be {done}" if result.dry_run else done
        cells = "" if "" in result.parts else \
            " (" + ", ".join(f"{cell} {part.changed:,}" for cell, part in result.parts.items()) + ")"
        sample = result.labels("sample")[:parked.SAMPLE]
        print(f"{result.changed} {head}{where}{cells}" + (": " + ", ".join(sample)
                                                          + (" ..." if result.changed > len(sample) else "")
                                                          if sample else ""))
        refused = result.refused()
        if refused:
            print(f"{len(refused)} refused by Kafka, left parked with the refusal as their reason:")
            for name, reason in refused[:parked.SAMPLE]:
                print(f"  {name}  {reason}")
        not_allowed = result.labels("not_allowed")
        if not_allowed:
            print(f"{len(not_allowed)} left parked: CHRONOS_ALLOWED_TOPICS does not allow the topic they were "
                  "going to (give --to): " + ", ".join(not_allowed[:parked.SAMPLE]))
        not_found = result.labels("not_found")
        if not_found:
            print(f"{len(not_found)} not found: " + ", ".join(not_found[:parked.SAMPLE]))
    result.check()
