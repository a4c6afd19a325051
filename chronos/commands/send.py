"""`chronos send`: publish one delayed message to the input topic."""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from chronos import config
from chronos.commands._shared import DEADLINE_ECHO_HEADER
from chronos.errors import ChronosError, UnavailableError

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


def add_parser(sub: Any) -> None:
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
    except RuntimeError as exc:  # the input topic is missing, or Kafka refused the message
        raise ChronosError(str(exc)) from None
    print(message_id)
    return 0
