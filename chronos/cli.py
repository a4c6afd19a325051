"""The `chronos` command: the three processes, migrations, `up`, and tools to send and watch messages."""

from __future__ import annotations

import argparse
import re
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

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
    from chronos import runtime
    settings = config.load(args)
    if args.command == "consumer":
        from chronos.consumer import run
    elif args.command == "firer":
        from chronos.firer import run
    else:
        from chronos.detector import run
    return runtime.run_process(args.command, settings, run)


def cmd_migrate(args: argparse.Namespace) -> int:
    from chronos import store
    settings = config.load(args)
    if not settings.database_url:
        raise config.ConfigError("CHRONOS_DATABASE_URL is not set: give --database-url or --ready-file")
    applied = store.migrate(settings.database_url)
    if applied:
        print(f"applied migrations {', '.join(map(str, applied))}; schema at version {store.LATEST_VERSION}")
    else:
        print(f"schema already at version {store.LATEST_VERSION}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from chronos import stack
    return stack.run(args)


def cmd_send(args: argparse.Namespace) -> int:
    from chronos.client import Scheduler
    from chronos.kafka import check_reachable, producer_config
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
    from confluent_kafka import OFFSET_BEGINNING, Consumer

    from chronos import codec
    from chronos.kafka import PRODUCER_ONLY, check_reachable
    settings = config.load(args)
    if not settings.kafka_bootstrap_servers:
        raise config.ConfigError("no Kafka to read from: give --ready-file or --kafka-bootstrap-servers")
    topic = args.topic or settings.output_topic
    conf = {"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": f"chronos-tail-{uuid.uuid4()}",
            "enable.auto.commit": "false", "auto.offset.reset": "earliest",
            **{k: v for k, v in settings.kafka_config.items() if k not in PRODUCER_ONLY}}
    check_reachable(settings.kafka_bootstrap_servers, settings.kafka_config, secrets=settings.secrets())
    consumer = Consumer(conf)

    def on_assign(c, partitions):
        if args.from_beginning:
            for p in partitions:
                p.offset = OFFSET_BEGINNING
        c.assign(partitions)

    consumer.subscribe([topic], on_assign=on_assign)
    started = time.time()
    seen = 0
    try:
        while args.count is None or seen < args.count:
            if args.timeout and time.time() - started > args.timeout:
                break
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            arrived = time.time()
            # read_headers, not msg.headers(): a header name that is not UTF-8 must not stop the tail
            sent_deadline = dict(codec.read_headers(msg)[0] or []).get(DEADLINE_ECHO_HEADER)
            key = msg.key().decode(errors="replace") if msg.key() is not None else None
            value = msg.value().decode(errors="replace") if msg.value() is not None else None
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

    from chronos import cron
    from chronos.store import Store
    settings = config.load(args)
    if not settings.database_url:
        raise config.ConfigError("CHRONOS_DATABASE_URL is not set: give --database-url or --ready-file")
    store = Store(settings.database_url)
    rows = store.list_schedules()
    store.close()
    schedules = [{"id": sid, "cron": expr, "timezone": tz,
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


# -- parser --------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chronos", description="Chronos: a persistent time-delay scheduler "
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
    config.add_arguments(p, only=("database_url", "log_level"))
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("up", help="run the whole stack in the foreground (embedded PostgreSQL and broker "
                                  "unless real ones are configured)")
    config.add_arguments(p)
    from chronos.stack import add_arguments as up_arguments
    up_arguments(p)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("send", help="publish one delayed message to the input topic; prints its id")
    config.add_arguments(p, only=("kafka_bootstrap_servers", "input_topic", "kafka_properties",
                                  "kafka_properties_file"))
    p.add_argument("--delay", default="5s", help="delay from now, e.g. 500ms, 5s, 2m (default 5s)")
    p.add_argument("--at", default=None, help="deadline as ISO-8601 instead of --delay")
    p.add_argument("--key", default=None)
    p.add_argument("--value", default="")
    p.add_argument("--id", default=None, help="message id (default: a new UUID)")
    p.add_argument("--topic", default=None, help="destination topic (chronosTopic), default the output topic")
    p.add_argument("--ordering-key", default=None)
    p.add_argument("--header", action="append", metavar="KEY=VALUE", help="extra header (repeatable)")
    p.set_defaults(func=cmd_send)

    p = sub.add_parser("schedules", help="list recurring (cron) schedules and their next occurrence")
    config.add_arguments(p, only=("database_url",))
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("tail", help="print messages arriving on the output topic")
    config.add_arguments(p, only=("kafka_bootstrap_servers", "output_topic", "kafka_properties",
                                  "kafka_properties_file"))
    p.add_argument("--topic", default=None, help="topic to read (default: the output topic)")
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--count", type=int, default=None, help="stop after this many messages")
    p.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("pipeline", help="Spark jobs: bulk scheduling and SLA reports (the spark extra)",
                       description="Spark jobs (pip install 'chronos-scheduler[spark]'); PySpark is imported "
                                   "only when a job runs")
    from chronos.pipeline.commands import add_parsers as pipeline_parsers
    pipeline_parsers(p)

    from chronos.status import add_parsers as operating_parsers
    operating_parsers(sub)
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

