"""Move the consumer group on the input topic back to a moment, after a restore (`chronos rewind`).

A restored store lacks what arrived after its backup; the group committed those offsets long ago, so
nothing reads them again by itself. The command joins the group as its only member (Chronos's
consumers stopped on every host), finds each partition's first offset at or after the moment
(`offsets_for_times`; the partition's end where nothing is that recent), commits those offsets and
leaves. It joins rather than committing from outside the group: on the embedded broker, a commit
from a client that never joined left the group unable to take members again.

It commits nothing unless it holds every partition of the topic: a member still in the group (a
consumer not stopped) would read on from where it is, and its next commit would undo the rewind.

With cells, a restore is one cell's: only the partitions that cell owns are read again (`only`), and the
others keep their offsets, so the cells not restored take nothing twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chronos import config
from chronos.errors import ChronosError, ConfigError, UnavailableError

ASSIGN_WAIT_S = 60.0  # how long to wait for the group to hand this member every partition
KAFKA_CALL_S = 10.0   # the deadline of each request to the broker


class GroupBusy(ChronosError):
    """Other members hold some of the topic's partitions: nothing was committed."""


@dataclass(frozen=True)
class Moved:
    partition: int
    was: int   # the group's committed offset before (-1001: none)
    now: int   # the offset committed (or, with --dry-run, that would be)


def parse_moment(text: str) -> datetime:
    """An ISO-8601 time with its zone (`Z` or an offset); a time without one is refused: the host's
    zone is not the backups' (their names are UTC), and a group moved to the wrong moment loses or
    repeats hours of input."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--to is not an ISO-8601 time: {text!r} (e.g. 2026-11-26T06:14:13Z)") from None
    if moment.tzinfo is None:
        raise ConfigError(f"--to {text!r} has no zone: add Z for UTC (backup names are UTC) or an offset "
                          "such as +01:00")
    return moment


def rewind(settings: config.Settings, moment: datetime, *, dry_run: bool = False,
           assign_wait: float = ASSIGN_WAIT_S, only: set[int] | None = None) -> list[Moved]:
    """Join the group, take every partition of the input topic, commit the offsets of `moment` (unless
    `dry_run`) on every partition or on those of `only`, leave. Raises GroupBusy, committing nothing, when other
    members keep partitions."""
    from confluent_kafka import KafkaException, TopicPartition

    from chronos.adapters.kafka.admin import check_reachable
    from chronos.adapters.kafka.clients import make_consumer
    if not settings.kafka_bootstrap_servers:
        raise ConfigError("no Kafka to rewind: give --kafka-bootstrap-servers (or CHRONOS_KAFKA_BOOTSTRAP_SERVERS)")
    check_reachable(settings.kafka_bootstrap_servers, settings.kafka_config, secrets=settings.secrets())
    topic, group = settings.input_topic, settings.consumer_group
    consumer, _ = make_consumer(settings, "rewind", **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    try:
        meta = consumer.list_topics(topic, timeout=KAFKA_CALL_S).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ConfigError(f"input topic {topic} does not exist on {settings.kafka_bootstrap_servers}")
        every = set(meta.partitions)
        held: set[int] = set()

        def assigned(_c: Any, partitions: list) -> None:
            held.update(tp.partition for tp in partitions)

        def revoked(_c: Any, partitions: list) -> None:
            held.difference_update(tp.partition for tp in partitions)
        consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked)
        deadline = time.monotonic() + assign_wait
        while held != every and time.monotonic() < deadline:
            consumer.poll(0.2)
        if only is not None and not only <= every:
            raise ConfigError(f"input topic {topic} has no partition {min(only - every)}")
        if held != every:
            raise GroupBusy(f"group {group} gave this command {len(held)} of the {len(every)} partitions of {topic} "
                            f"within {assign_wait:.0f}s: other members hold the rest. Stop Chronos's consumers on "
                            "every host first; nothing was committed")
        chosen = sorted(every if only is None else only)
        partitions = [TopicPartition(topic, p) for p in chosen]
        was = {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=KAFKA_CALL_S)}
        at_ms = int(moment.timestamp() * 1000)
        found = consumer.offsets_for_times([TopicPartition(topic, p, at_ms) for p in chosen], timeout=KAFKA_CALL_S)
        offsets = [TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else
                                  consumer.get_watermark_offsets(tp, timeout=KAFKA_CALL_S)[1]) for tp in found]
        if not dry_run:
            consumer.commit(offsets=offsets, asynchronous=False)
        return [Moved(tp.partition, was.get(tp.partition, -1001), tp.offset) for tp in offsets]
    except KafkaException as exc:
        raise UnavailableError(f"Kafka at {settings.kafka_bootstrap_servers}: {exc}") from None
    finally:
        consumer.close()
