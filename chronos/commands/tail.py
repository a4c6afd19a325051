"""`chronos tail`: print what arrives on the output topic, with its lateness."""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from chronos import config
from chronos.commands._shared import DEADLINE_ECHO_HEADER


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tail", help="print messages arriving on the output topic")
    config.add_arguments(p, only=("kafka_bootstrap_servers", "output_topic", "kafka_properties",
                                  "kafka_properties_file"))
    p.add_argument("--topic", default=None, help="topic to read (default: the output topic)")
    p.add_argument("--from-beginning", action="store_true",
                   help="read the topic from its start (default: what arrives from now on)")
    p.add_argument("--count", type=int, default=None, help="stop after this many messages")
    p.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
