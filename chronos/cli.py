"""The `chronos` command: the three processes, migrations, `up`, and tools to send and watch messages."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn

from chronos import __version__, config
from chronos.errors import ChronosError, UnavailableError

DEADLINE_ECHO_HEADER = "x-deadline-ms"
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: str) -> timedelta:
    """`250ms`, `5s`, `2m`, `1.5h`, `3d`, or plain seconds."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise config.ConfigError(f"not a duration: {text!r} (use e.g. 500ms, 5s, 2m, 1h, 3d)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def parse_at(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise config.ConfigError(f"--at is not an ISO-8601 time: {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


# -- commands ------------------------------------------------------------------------------

def cmd_process(args: argparse.Namespace) -> int:
    from chronos import processes
    return processes.main(args.command, config.load(args))


def cmd_migrate(args: argparse.Namespace) -> int:
    from chronos.adapters.postgres import migrations, pooling
    settings = config.load(args)
    url = settings.require_database()
    # a pool mode the processes would fail with is found here, before they start
    if pooling.resolve_pool_mode(url, settings.database_pool_mode, check=True) == pooling.TRANSACTION:
        print("PostgreSQL is reached through a pooler in transaction mode: the processes prepare no statement "
              "and make their settings in each transaction")
    applied = migrations.migrate(url)
    if applied:
        print(f"applied migrations {', '.join(map(str, applied))}; schema at version {migrations.LATEST_VERSION}")
    else:
        print(f"schema already at version {migrations.LATEST_VERSION}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from chronos import embedded
    from chronos.up import command
    # before anything starts: the servers it would embed come with the embedded extra
    given = {"PostgreSQL": args.database_url or os.environ.get("CHRONOS_DATABASE_URL"),
             "broker": args.kafka_bootstrap_servers or args.kafka_bootstrap_servers_alias
             or os.environ.get("CHRONOS_KAFKA_BOOTSTRAP_SERVERS")}
    embedded.require_extra(*(server for server, url in given.items() if not url))
    return command.run(args)


def cmd_send(args: argparse.Namespace) -> int:
    from chronos.client import Scheduler
    from chronos.adapters.kafka.admin import check_reachable
    from chronos.adapters.kafka.clients import producer_config
    settings = config.load(args)
    if not settings.kafka_bootstrap_servers:
        raise config.ConfigError("no Kafka to send to: give --ready-file or --kafka-bootstrap-servers")
    headers = []
    for item in args.header or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise config.ConfigError(f"--header must be key=value, got {item!r}")
        headers.append((key, value.encode()))
    when = parse_at(args.at) if args.at else datetime.now(timezone.utc) + parse_duration(args.delay)
    # relayed untouched (not a chronos header), so `chronos tail` can print the lateness
    headers.append((DEADLINE_ECHO_HEADER, str(int(when.timestamp() * 1000)).encode()))
    conf = {k: v for k, v in producer_config(settings).items() if k != "bootstrap.servers"}
    check_reachable(settings.kafka_bootstrap_servers, settings.kafka_config, secrets=settings.secrets())
    scheduler = Scheduler(settings.kafka_bootstrap_servers, input_topic=settings.input_topic, config=conf)
    try:
        with scheduler:
            message_id = scheduler.send_later(args.key, args.value, topic=args.topic, when=when,
                                              message_id=args.id, headers=headers, ordering_key=args.ordering_key)
    except TimeoutError as exc:
        raise UnavailableError(f"Kafka at {settings.kafka_bootstrap_servers} did not acknowledge: {exc}") from None
    print(message_id)
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    """Print what arrives on the output topic, with its lateness against the deadline it was sent with."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from chronos import codec
    from chronos.adapters.kafka.admin import check_reachable
    from chronos.adapters.kafka.clients import PRODUCER_ONLY
    settings = config.load(args)
    if not settings.kafka_bootstrap_servers:
        raise config.ConfigError("no Kafka to read from: give --ready-file or --kafka-bootstrap-servers")
    topic = args.topic or settings.output_topic
    conf = {"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": f"chronos-tail-{uuid.uuid4()}",
            "enable.auto.commit": "false", "auto.offset.reset": "earliest",
            **{k: v for k, v in settings.kafka_config.items() if k not in PRODUCER_ONLY}}
    check_reachable(settings.kafka_bootstrap_servers, settings.kafka_config, secrets=settings.secrets())
    consumer = Consumer(conf)
    started = time.time()
    since_ms = int(started * 1000)

    def on_assign(c, partitions):
        if args.from_beginning:
            for p in partitions:
                p.offset = OFFSET_BEGINNING
        else:  # what arrives from now on: each partition from its first message stamped since the start
            found = c.offsets_for_times([TopicPartition(p.topic, p.partition, since_ms) for p in partitions],
                                        timeout=10)
            for p, at in zip(partitions, found):
                p.offset = at.offset if at.offset >= 0 else OFFSET_END
        c.assign(partitions)

    consumer.subscribe([topic], on_assign=on_assign)
    seen = 0
    try:
        while args.count is None or seen < args.count:
            if args.timeout and time.time() - started > args.timeout:
                break
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            if not args.from_beginning and msg.timestamp()[1] < since_ms:
                continue  # a broker's "end" may lie before its last messages (the embedded one's does)
            arrived = time.time()
            # read_headers, not msg.headers(): a header name that is not UTF-8 must not stop the tail
            sent_deadline = dict(codec.read_headers(msg)[0] or []).get(DEADLINE_ECHO_HEADER)
            raw_key, raw_value = msg.key(), msg.value()
            key = raw_key.decode(errors="replace") if raw_key is not None else None
            value = raw_value.decode(errors="replace") if raw_value is not None else None
            line = f"{datetime.fromtimestamp(arrived, timezone.utc).isoformat(timespec='milliseconds')} " \
                   f"{msg.topic()}[{msg.partition()}]@{msg.offset()} key={key!r} value={value!r}"
            if sent_deadline:
                line += f" lateness_ms={arrived * 1000 - int(sent_deadline):.1f}"
            print(line, flush=True)
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0


def cmd_schedules(args: argparse.Namespace) -> int:
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


# -- operators: show, list, cancel, fire-now, reschedule (chronos/ops/inspect.py does the work) ---

def _operator_store(args: argparse.Namespace):
    from chronos.adapters.postgres.store import Store
    settings = config.load(args)
    return settings, Store(settings.require_database(), pool_mode=settings.database_pool_mode)


def _print_json(data) -> None:
    import orjson
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def _filters(args: argparse.Namespace, settings: config.Settings, now: datetime):
    from chronos.ops import inspect
    return inspect.filters_for(
        output_topic=settings.output_topic,
        due_after=inspect.parse_time(args.due_after, now, "--due-after") if args.due_after else None,
        due_before=inspect.parse_time(args.due_before, now, "--due-before") if args.due_before else None,
        topic=args.topic, key=inspect.parse_key(args.key), ordering_key=args.ordering_key,
        id_prefix=args.id_prefix, state=args.state)


def cmd_show(args: argparse.Namespace) -> int:
    """One message or schedule, everything the store knows; exit 1 when it is not there."""
    from chronos.ops import inspect
    settings, store = _operator_store(args)
    try:
        m = store.show(args.id, output_topic=settings.output_topic)
    finally:
        store.close()
    if args.json:
        _print_json(inspect.to_json(m))
    elif m is None:
        print(f"{args.id!r}: not_found")
    else:
        lines = [("id", repr(m.id)), ("state", m.state), *inspect.schedule_facts(m)]
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


def cmd_list(args: argparse.Namespace) -> int:
    """A page of waiting, in-flight and recurring messages matching the filters, with the next cursor."""
    from chronos.ops import inspect
    settings, store = _operator_store(args)
    try:
        limit = config._positive_int("--limit", args.limit)
        page = inspect.list_messages(store, _filters(args, settings, datetime.now(timezone.utc)),
                                     output_topic=settings.output_topic, limit=limit, after=args.after)
    finally:
        store.close()
    if args.json:
        _print_json(inspect.to_json(page))
        return 0
    for m in page.items:
        print(f"{inspect.iso(m.deadline)}  {m.state:<9}  {m.id!r}  topic={m.topic} key={inspect.safe_text(m.key, 32)}"
              + (f" ordering_key={m.ordering_key!r}" if m.ordering_key is not None else "")
              + (f" cron={m.cron!r}" if m.cron else "") + (f" firer={m.firer}" if m.firer else ""))
    if not page.items:
        print("no messages match")
    if page.cursor:
        print(f"next page: --after {page.cursor}")
    return 0


def cmd_act(args: argparse.Namespace) -> int:
    """cancel, fire-now, reschedule: by ids or by --filter; --dry-run; --yes above the threshold."""
    from chronos.ops import inspect
    from chronos import logs
    action = args.command.replace("-", "_")
    settings, store = _operator_store(args)
    logs.setup("operator", str(uuid.uuid4()), settings.log_level, settings.log_format, settings.secrets())
    now = datetime.now(timezone.utc)
    filters = _filters(args, settings, now) if args.filter else None
    if filters is None and any(getattr(args, a) is not None for a in _FILTER_FLAGS):
        raise config.ConfigError("filters act only with --filter (so a typo never widens an action)")
    if filters is not None and args.ids:
        raise config.ConfigError("give message ids, or --filter with filters, not both")
    if filters is None and not args.ids:
        raise config.ConfigError(f"give the ids of the messages to {args.command}, or --filter with filters")
    at = None
    if action == "reschedule":
        if (args.at is None) == (args.delay is None):
            raise config.ConfigError("reschedule needs one of --at or --delay")
        at = inspect.parse_time(args.at, now, "--at") if args.at else now + inspect.parse_delay(args.delay)
    try:
        result = inspect.act(store, action, ids=args.ids, filters=filters, output_topic=settings.output_topic,
                             at=at, dry_run=args.dry_run, confirm_above=settings.confirm_above, yes=args.yes)
    finally:
        store.close()
    if args.json:
        _print_json(inspect.to_json(result))
    else:
        verb = {"cancel": "cancelled", "fire_now": "made due now", "reschedule": "rescheduled"}[action]
        head = f"would be {verb}" if args.dry_run else verb
        when = f" (to {inspect.iso(result.at)})" if result.at and action == "reschedule" else ""
        print(f"{result.changed} {head}{when}" + (": " + ", ".join(repr(i) for i in result.sample)
                                              + (" ..." if result.changed > len(result.sample) else "")
                                              if result.sample else ""))
        if result.in_flight:
            print(f"{len(result.in_flight)} in flight (a firer is publishing them), left alone: "
                  + ", ".join(repr(i) for i in result.in_flight[:inspect.SAMPLE]))
        if result.not_found:
            print(f"{len(result.not_found)} not found: " + ", ".join(repr(i) for i in result.not_found[:inspect.SAMPLE]))
    result.check()
    return 0


_FILTER_FLAGS = ("due_before", "due_after", "topic", "key", "ordering_key", "id_prefix", "state")


def _add_filter_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filters")
    g.add_argument("--due-before", default=None, metavar="TIME", help="deadline before TIME: ISO-8601, or "
                   "relative to now like 10m, -2h, 1d")
    g.add_argument("--due-after", default=None, metavar="TIME", help="deadline after TIME")
    g.add_argument("--topic", default=None, help="destination topic")
    g.add_argument("--key", default=None, help="message key: UTF-8 text, or hex:0a1b...")
    g.add_argument("--ordering-key", default=None, help="ordering key (chronosOrderingKey)")
    g.add_argument("--id-prefix", default=None, help="ids starting with this (lists in id order)")
    g.add_argument("--state", default=None, help="waiting, in_flight or recurring")


def add_operator_parsers(sub) -> None:
    """show, list, cancel, fire-now, reschedule."""
    settings_used = ("database_url", "database_pool_mode", "output_topic")
    p = sub.add_parser("show", help="one message or schedule: state, deadline, topic, key, headers, value",
                       description="Print everything the store holds about one id. Exit 1 when it is not there.")
    config.add_arguments(p, only=settings_used)
    p.add_argument("id", help="the message or schedule id")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("list", help="search waiting, in-flight and recurring messages, a page at a time",
                       description="Messages matching every filter given, in deadline order (id order with "
                                   "--id-prefix); each page prints the cursor of the next.")
    config.add_arguments(p, only=settings_used)
    _add_filter_arguments(p)
    p.add_argument("--limit", default="50", help="messages per page (default 50)")
    p.add_argument("--after", default=None, metavar="CURSOR", help="the cursor printed with the previous page")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=cmd_list)

    for name, text in (("cancel", "remove waiting messages and recurring schedules"),
                       ("fire-now", "make waiting messages due now (a schedule: one occurrence now)"),
                       ("reschedule", "give waiting messages or schedules a new deadline")):
        p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}, by id or by --filter. "
                           "Messages a firer holds (in flight) are left alone and reported (exit 8); unknown ids "
                           "exit 6; more than CHRONOS_CONFIRM_ABOVE messages need --yes (exit 7 without).")
        config.add_arguments(p, only=settings_used + ("confirm_above", "log_level", "log_format"))
        p.add_argument("ids", nargs="*", metavar="ID", help="ids of the messages or schedules (or --filter)")
        p.add_argument("--filter", action="store_true", help="act on every message matching the filters")
        _add_filter_arguments(p)
        if name == "reschedule":
            p.add_argument("--at", default=None, metavar="TIME", help="new deadline: ISO-8601 or relative like 2h")
            p.add_argument("--delay", default=None, help="new deadline this far from now: 30s, 10m, 2h, 1d")
        p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
        p.add_argument("--yes", action="store_true", help="act even on more than CHRONOS_CONFIRM_ABOVE messages")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
        p.set_defaults(func=cmd_act)


# -- parser --------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit 2, like every other bad input (sub-commands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="chronos", description="Chronos: a persistent time-delay scheduler "
                                     "for Kafka. Every setting is also a CHRONOS_* environment variable.")
    parser.add_argument("--version", action="version", version=f"chronos {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, text in (("consumer", "consume the input topic into the store"),
                       ("firer", "publish stored messages at their deadlines"),
                       ("detector", "hand back messages held by a failed firer")):
        p = sub.add_parser(name, help=text, description=text)
        config.add_arguments(p)
        p.set_defaults(func=cmd_process)

    p = sub.add_parser("migrate", help="create or upgrade the database schema (idempotent)")
    config.add_arguments(p, only=("database_url", "database_pool_mode", "log_level"))
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("up", help="run the whole stack in the foreground (embedded PostgreSQL and broker "
                                  "unless real ones are configured)")
    config.add_arguments(p)
    from chronos.up.command import add_arguments as up_arguments
    up_arguments(p)
    p.set_defaults(func=cmd_up)

    from chronos.embedded.patroni import add_parser as pg_cluster_parser
    pg_cluster_parser(sub)

    p = sub.add_parser("send", help="publish one delayed message to the input topic; prints its id")
    config.add_arguments(p, only=("kafka_bootstrap_servers", "input_topic", "kafka_properties",
                                  "kafka_properties_file"))
    p.add_argument("--delay", default="5s", help="delay from now, e.g. 500ms, 5s, 2m (default 5s)")
    p.add_argument("--at", default=None, help="deadline as ISO-8601 instead of --delay")
    p.add_argument("--key", default=None, help="message key, as UTF-8 (default: a null key)")
    p.add_argument("--value", default="", help="message value, as UTF-8 (default: empty)")
    p.add_argument("--id", default=None, help="message id (default: a new UUID)")
    p.add_argument("--topic", default=None, help="destination topic (chronosTopic), default the output topic")
    p.add_argument("--ordering-key", default=None, help="ordering key (chronosOrderingKey)")
    p.add_argument("--header", action="append", metavar="KEY=VALUE", help="extra header (repeatable)")
    p.set_defaults(func=cmd_send)

    p = sub.add_parser("schedules", help="list recurring (cron) schedules and their next occurrence")
    config.add_arguments(p, only=("database_url", "database_pool_mode"))
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("tail", help="print messages arriving on the output topic")
    config.add_arguments(p, only=("kafka_bootstrap_servers", "output_topic", "kafka_properties",
                                  "kafka_properties_file"))
    p.add_argument("--topic", default=None, help="topic to read (default: the output topic)")
    p.add_argument("--from-beginning", action="store_true",
                   help="read the topic from its start (default: what arrives from now on)")
    p.add_argument("--count", type=int, default=None, help="stop after this many messages")
    p.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("pipeline", help="Spark jobs: bulk scheduling and SLA reports (the spark extra)",
                       description="Spark jobs (pip install 'chronos-scheduler[spark]'); PySpark is imported "
                                   "only when a job runs")
    from chronos.pipeline.commands import add_parsers as pipeline_parsers
    pipeline_parsers(p)

    from chronos.ops.status import add_parsers as operating_parsers
    operating_parsers(sub)
    from chronos.ops.rewind import add_parser as rewind_parser
    rewind_parser(sub)
    from chronos.ops.targets import add_parser as targets_parser
    targets_parser(sub)
    add_operator_parsers(sub)

    from chronos.console import add_parser as console_parser
    console_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ChronosError as exc:
        print(f"chronos {args.command}: {config.redact_url(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130

