"""Kafka clients: configuration, outage logging, publishing and what a failed publish means."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Consumer as KafkaConsumer

from chronos.config import SECRET_KAFKA_KEYS, Settings
from chronos.domain.reasons import PUBLISH_FAILED, TOO_LARGE
from chronos.errors import ConfigError
from chronos.ports import Publisher
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
    return _make(Producer, producer_config(settings, **overrides), settings, what)


def make_consumer(settings: Settings, what: str, **overrides: Any) -> tuple[KafkaConsumer, OutageLog]:
    return _make(KafkaConsumer, consumer_config(settings, **overrides), settings, what)


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


def answers(client: Publisher, timeout: float = 1.0) -> bool:
    """Whether Kafka answers the client's metadata request (for every topic: asking for one would let
    a producer create it) within `timeout` seconds."""
    try:
        client.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


def produce(producer: Publisher, topic: str, value: bytes | None, key: bytes | None,
            headers: list | None, on_delivery: Callable) -> None:
    """Produce, waiting for queue space instead of failing when the local queue is full.

    Never raises: librdkafka refuses some messages inside `produce()` itself (a value over the
    producer's `message.max.bytes`, an invalid topic name), and such a refusal is handed to
    `on_delivery(err, None)` at once, so every failure goes through the one delivery path."""
    while True:
        try:
            producer.produce(topic, value, key, headers=headers or None, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else \
                KafkaError(KafkaError._FAIL, str(exc))
            on_delivery(err, None)
            return


# Refusals that no retry can change: the message is too large or malformed for the producer or the
# broker.
PERMANENT = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD})
SIZE_ERRORS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
# Refusals about the message's topic that may pass: an invalid or unknown topic, a denied write, a
# partition without enough replicas. Retried a bounded number of times, since a topic can be created
# and a permission granted.
TOPIC_REFUSALS = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_EXCEPTION, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.POLICY_VIOLATION,
    KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError.INVALID_TIMESTAMP,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError._INVALID_ARG})
# Failures that say nothing about the message: Kafka did not answer in time (an outage). The firer
# already stops claiming while acknowledgements stall, so these are handed back, not counted.
UNANSWERED = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                        KafkaError._ALL_BROKERS_DOWN, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
# Failures about the producer's own identity or state at the broker, whatever the message: fenced
# (a broker that lost track of a topic's producers fences them all: seen when a topic was deleted and
# created again), an epoch or producer id it no longer knows (a broker restarted), a broken sequence,
# no permission to write idempotently. The producer is replaced and the message handed back uncounted.
PRODUCER_STATE = frozenset({
    KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.DUPLICATE_SEQUENCE_NUMBER,
    KafkaError.INVALID_PRODUCER_ID_MAPPING, KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError._FATAL,
    KafkaError._INCONSISTENT, KafkaError._GAPLESS_GUARANTEE, KafkaError._STATE})

PERMANENT_FAILURE, REFUSED, UNANSWERED_FAILURE = "permanent", "refused", "unanswered"
PRODUCER_FAILURE, UNCLEAR_FAILURE = "producer", "unclear"


def classify(err: KafkaError) -> str:
    """What a failed publish means, from its error alone:

    - `permanent`: the message can never be published (dead-letter it now);
    - `refused`: its topic refuses it for a reason that may pass (retry with backoff, a bounded number
      of times);
    - `unanswered`: Kafka did not answer (an outage: hand it back, it says nothing about the message);
    - `producer`: the producer itself is at fault (replace it, hand the message back uncounted);
    - `unclear`: any other error (`watch.ProducerWatch` decides: the producer's fault unless it was
      acknowledged lately)."""
    code = err.code()
    if code in PERMANENT:
        return PERMANENT_FAILURE
    if code in UNANSWERED:
        return UNANSWERED_FAILURE
    if code in PRODUCER_STATE or err.fatal():
        return PRODUCER_FAILURE
    if code in TOPIC_REFUSALS:
        return REFUSED
    return UNCLEAR_FAILURE


def failure_reason(err: KafkaError) -> str:
    """The dead-letter reason for a publish that failed with `err`: `<reason>: <detail>`."""
    code = TOO_LARGE if err.code() in SIZE_ERRORS else PUBLISH_FAILED
    return f"{code}: {err.name()}: {err.str()}"


ERROR_HEADER = "chronosError"
SOURCE_HEADER = "chronosSource"


def dead_letter_headers(headers: list, reason: str, source: str) -> list:
    """A dead letter's headers: the message's own, then `chronosError: <reason>: <detail>` and
    `chronosSource` (`<topic>/<partition>/<offset>` of the input, or `store/<id>`)."""
    return [*headers, (ERROR_HEADER, reason.encode()), (SOURCE_HEADER, source.encode())]

