"""Kafka clients: configuration, outage logging, and the confluent-kafka clients behind the Kafka ports
(`chronos.ports`): `Producer` (a `Publisher`), `GroupConsumer` (an `InputConsumer` and a `GroupWatcher`).

confluent-kafka's own types stay here: its `Message` and `KafkaError` satisfy the ports' `InputMessage`
and the domain's `DeliveryError` as they are; `TopicPartition`s are built and read here; a
`KafkaException` a request raises becomes `KafkaUnanswered`, or a failed delivery report."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from chronos.config import SECRET_KAFKA_KEYS, Settings
from chronos.errors import ConfigError, KafkaUnanswered
from chronos.logs import RepeatFilter

log = logging.getLogger("chronos.kafka")
# librdkafka's own log lines go through logging (one format, JSON included), each kind at most
# once per 30 s: it would otherwise print every reconnect attempt to stderr.
LIBRDKAFKA_LOG = logging.getLogger("chronos.librdkafka")
LIBRDKAFKA_LOG.addFilter(RepeatFilter(30.0))

# Settings tuned for Chronos, overridable by CHRONOS_KAFKA_PROPERTIES (the user's word wins).
PRODUCER_DEFAULTS = {
    "acks": "all",
    "enable.idempotence": "true",
    # Same partition for the same key as the Java client, so keyed consumers see no difference.
    "partitioner": "murmur2_random",
    "linger.ms": "5",
    "compression.type": "none",
    "queue.buffering.max.messages": "500000",
}
# The embedded broker's client profile (docs/operations/embedded-stack.md), never for a real cluster. A
# consumer group's first join waits about half the session timeout: short group timeouts. The broker's
# cost is listing: every fetch that finds a partition's reader behind lists every batch the partition
# ever stored (nothing is freed), so its CPU follows (listing fetches per second) x (stored batches).
# Hence larger produce batches (linger 100 ms: a quarter of the output batches of 25 ms at a steady
# rate, for up to 100 ms more before the broker has a message, of which the firer's measured advance
# makes up as much as the timing advance allows) and a long consumer fetch wait (500 ms: a
# fetch with nothing new looks again after half of it, so a reader at the head lists about four times
# a second instead of twenty with 100 ms; Chronos's intake waits up to that long, which a message's
# delay absorbs and the timing advance does not see). A shorter wait is worse on a long partition too:
# the broker lists only until the wait runs out, and a reader past what it listed gets nothing at all.
# Tests take the group timeouts and a shorter fetch wait (their topics stay short).
EMBEDDED_GROUP_TIMEOUTS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}
EMBEDDED_PROFILE = {**EMBEDDED_GROUP_TIMEOUTS, "fetch.wait.max.ms": "500", "linger.ms": "100"}
CONSUMER_DEFAULTS = {
    "enable.auto.commit": "false",
    "auto.offset.reset": "earliest",
    "enable.partition.eof": "false",
}
# Consumer-only and producer-only keys are dropped from the other client's configuration so
# librdkafka does not warn about them on every start.
CONSUMER_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "fetch.wait.max.ms", "fetch.min.bytes",
                  "auto.offset.reset", "max.poll.interval.ms", "group.id", "enable.auto.commit",
                  "partition.assignment.strategy", "fetch.max.bytes", "max.partition.fetch.bytes",
                  "enable.partition.eof", "isolation.level", "queued.min.messages", "group.instance.id")
PRODUCER_ONLY = ("acks", "enable.idempotence", "linger.ms", "batch.size", "compression.type", "partitioner",
                  "queue.buffering.max.messages", "queue.buffering.max.kbytes", "message.timeout.ms",
                  "delivery.timeout.ms", "batch.num.messages", "retries", "retry.backoff.ms")


# librdkafka's errors for a broker that refused this client's TLS or SASL settings, or whose certificate
# this client refused: new settings fix them, retrying with the same ones does not.
REFUSED_CONNECTION = frozenset({KafkaError._SSL, KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})


class OutageLog:
    """librdkafka reports a down broker, or a refused handshake, at every reconnect attempt: log it once
    per outage, and the recovery."""

    def __init__(self, what: str):
        self.what = what
        self.down_since: float | None = None

    def error(self, err: KafkaError) -> None:
        if err.code() in REFUSED_CONNECTION:
            if self.down_since is None:
                self.down_since = time.monotonic()
            # a refusal that follows the outage's first error (a connection dropped, then refused) is
            # still worth its own line: it says what to fix
            if not self.refused:
                self.refused = True
                log.error("kafka refused the connection of the %s (%s): check its TLS and SASL settings; "
                          "librdkafka keeps retrying", self.what, err.str())
        elif err.code() in UNREACHABLE:
            if self.down_since is None:
                self.down_since = time.monotonic()
                log.warning("kafka unavailable for %s (%s); librdkafka keeps retrying", self.what, err.str())
        elif err.fatal():
            log.error("kafka fatal error in %s: %s", self.what, err.str())
        else:
            log.warning("kafka error in %s: %s", self.what, err.str())

    refused = False  # a refusal was logged in the outage going on

    def ok(self) -> None:
        if self.down_since is not None:
            log.warning("kafka reachable again for %s after %.1fs", self.what, time.monotonic() - self.down_since)
            self.down_since = None
            self.refused = False


def base_config(settings: Settings) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": settings.kafka_bootstrap_servers}
    conf.update(settings.kafka_config)
    return conf


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    conf = {**PRODUCER_DEFAULTS, **overrides}
    conf.update({k: v for k, v in base_config(settings).items() if k not in CONSUMER_ONLY})
    return conf


def consumer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    conf = {**CONSUMER_DEFAULTS, "group.id": settings.consumer_group, **overrides}
    conf.update({k: v for k, v in base_config(settings).items() if k not in PRODUCER_ONLY})
    return conf


def describe(conf: dict[str, Any]) -> str:
    """The configuration for a log line, secrets replaced."""
    return ", ".join(f"{k}={'***' if k in SECRET_KAFKA_KEYS else v}" for k, v in sorted(conf.items()))


def make_producer(settings: Settings, what: str, **overrides: Any) -> tuple[Producer, OutageLog]:
    """A producer for `what`, and the log of its outages."""
    return _make(Producer, producer_config(settings, **overrides), settings, what)


def make_consumer(settings: Settings, what: str, **overrides: Any) -> tuple[GroupConsumer, OutageLog]:
    """A consumer of the group for `what`, and the log of its outages."""
    return _make(GroupConsumer, consumer_config(settings, **overrides), settings, what)


def _make(cls, conf: dict[str, Any], settings: Settings, what: str):
    """A client whose errors go to one outage log and whose own logs go through `logging`."""
    outage = OutageLog(what)
    conf["error_cb"] = outage.error
    conf.setdefault("logger", LIBRDKAFKA_LOG)
    return _create(cls, conf, settings, what), outage


def error_text(exc: KafkaException, secrets: list[str]) -> str:
    text = exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else str(exc)
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _create(cls, conf: dict[str, Any], settings: Settings, what: str):
    """A client, or a one-line ConfigError when librdkafka refuses the settings (an unknown property,
    an unreadable certificate, ...): a traceback and a restart would not fix them."""
    try:
        return cls(conf)
    except KafkaException as exc:
        raise ConfigError(f"Kafka settings of the {what} are not valid: {error_text(exc, settings.secrets())}") \
            from None


class Producer(confluent_kafka.Producer):
    """confluent-kafka's producer, a `chronos.ports.Publisher`."""

    def send(self, topic: str, value: bytes | None, key: bytes | None, headers: list | None,
             on_delivery: Callable) -> None:
        """Produce, waiting for queue space instead of failing when the local queue is full.

        Never raises: librdkafka refuses some messages inside `produce()` itself (a value over the
        producer's `message.max.bytes`, an invalid topic name), and such a refusal is handed to
        `on_delivery(err, None)` at once, so every failure goes through the one delivery path."""
        while True:
            try:
                self.produce(topic, value, key, headers=headers or None, on_delivery=on_delivery)
                return
            except BufferError:
                self.poll(0.05)
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else \
                    KafkaError(KafkaError._FAIL, str(exc))
                on_delivery(err, None)
                return

    def partitions(self, topic: str, timeout: float = 10.0) -> int | None:
        """`ports.Publisher.partitions`."""
        try:
            found = self.list_topics(timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise KafkaUnanswered(str(exc)) from None
        return None if found is None or found.error is not None else len(found.partitions)

    def answers(self, timeout: float = 1.0) -> bool:
        """Whether Kafka answers a metadata request (for every topic: asking for one would let a
        producer create it) within `timeout` seconds."""
        try:
            self.list_topics(timeout=timeout)
        except KafkaException:
            return False
        return True


class GroupConsumer(confluent_kafka.Consumer):
    """confluent-kafka's consumer, a `chronos.ports.InputConsumer` (once subscribed) and a
    `chronos.ports.GroupWatcher` (never subscribed)."""

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = False) -> None:
        """Commit the next offset to read of each (topic, partition); asynchronously unless `wait`."""
        tps = [TopicPartition(topic, partition, offset) for (topic, partition), offset in offsets.items()]
        if wait:  # two calls: the client's overloads take `asynchronous` as a literal
            self.commit(offsets=tps, asynchronous=False)
        else:
            self.commit(offsets=tps, asynchronous=True)

    def pause_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        """`ports.InputConsumer.pause_partitions`; a partition no longer held (a rebalance) is passed over."""
        self._each("pause", [TopicPartition(topic, partition) for topic, partition in partitions])

    def resume_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        """`ports.InputConsumer.resume_partitions`."""
        self._each("resume", [TopicPartition(topic, partition) for topic, partition in partitions])

    def seek_partitions(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """`ports.InputConsumer.seek_partitions`."""
        for (topic, partition), offset in offsets.items():
            self._each("seek", TopicPartition(topic, partition, offset))

    def _each(self, method: str, arg: Any) -> None:
        try:
            getattr(confluent_kafka.Consumer, method)(self, arg)
        except KafkaException as exc:  # assigned elsewhere since: its next owner reads it from the last commit
            log.info("could not %s input partitions %s: %s", method, arg, exc)

    def ends(self) -> dict[int, tuple[int, int]]:
        """Per assigned partition, the position and the high watermark its last fetch reported (the
        client's cached one, which a fetch keeps right; asking the broker would cost a request and, on the
        embedded broker, be wrong); negative where not known yet (a partition not fetched yet)."""
        try:
            assigned = self.assignment()
            ends = {}
            for tp in self.position(assigned) if assigned else []:
                _, high = self.get_watermark_offsets(tp, cached=True)
                ends[tp.partition] = (max(-1, tp.offset), max(-1, high))
            return ends
        except KafkaException as exc:
            raise KafkaUnanswered(str(exc)) from None

    def group_progress(self, topic: str, timeout: float) -> dict[int, int] | None:
        """The group's committed offset of every partition of `topic`, or None when Kafka does not say
        in time (its coordinator out of reach)."""
        try:
            meta = self.list_topics(topic, timeout=timeout).topics.get(topic)
            if meta is None or meta.error is not None:
                return None
            partitions = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
            return {tp.partition: tp.offset for tp in self.committed(partitions, timeout=timeout)}
        except KafkaException:
            return None
