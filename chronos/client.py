"""`chronos.client.Scheduler`: schedule messages from Python by publishing to the input topic.

It only builds headers and produces; it never talks to PostgreSQL. Each message goes to the input
partition of its routing key (its ordering key, else its id: `chronos.domain.routing`), whatever its
Kafka key, so that a message, its cancel and its replace, and the messages of one ordering key, are
read from one partition, in the order they were sent.

    with Scheduler("localhost:9092") as s:
        mid = s.send_later(b"order-7", b"expire", delay=timedelta(minutes=30))
        s.cancel(mid)
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from confluent_kafka import KafkaException, Producer

from chronos.adapters.kafka.clients import PRODUCER_DEFAULTS
from chronos.codec import (HEADER_ACTION, HEADER_DEADLINE, HEADER_ID, HEADER_ORDERING_KEY, HEADER_TOPIC,
                           MAX_ID_LENGTH)
from chronos.domain.routing import partition_of

HeaderList = Iterable[tuple[str, bytes | str | None]]


def format_deadline(when: datetime) -> str:
    """ISO-8601 in UTC with milliseconds, the form Chronos documents (naive means UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    when = when.astimezone(timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def resolve_deadline(when: datetime | None, delay: timedelta | float | None, now: datetime) -> datetime:
    if (when is None) == (delay is None):
        raise ValueError("give exactly one of `when` and `delay`")
    if when is not None:
        return when
    if not isinstance(delay, timedelta):
        delay = timedelta(seconds=float(delay))  # type: ignore[arg-type]
    return now + delay


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def routing_key_of(headers: list[tuple[str, bytes | None]]) -> bytes:
    """The routing key of a message about to be sent: the bytes of its chronosOrderingKey header, else of its
    chronosMessageId (`chronos.domain.routing.routing_key` of what the consumer will read)."""
    found = dict(reversed(headers))  # the first of each name, as the consumer would refuse a repeated one
    return found.get(HEADER_ORDERING_KEY) or found.get(HEADER_ID) or b""


class Scheduler:
    def __init__(self, bootstrap_servers: str | None = None, *, input_topic: str = "chronos.input",
                 producer: Producer | None = None, config: dict[str, Any] | None = None,
                 metadata_timeout: float = 10.0):
        """`metadata_timeout`: how long the first message waits for Kafka to say how many partitions the
        input topic has (`TimeoutError` past it)."""
        if producer is None:
            if bootstrap_servers is None:
                raise ValueError("give bootstrap_servers or a producer")
            # Chronos's own producer settings: acknowledged by all replicas, idempotent (the partition is
            # chosen here, by the routing key, not by the producer's partitioner)
            producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": bootstrap_servers, **(config or {})})
        self.producer = producer
        self.input_topic = input_topic
        self.metadata_timeout = metadata_timeout
        self.errors: list[str] = []
        self._partitions: int | None = None

    def partitions(self) -> int:
        """The input topic's partition count, asked of Kafka once (the routing's modulus). `TimeoutError` if
        Kafka does not answer in time, `RuntimeError` if the topic does not exist."""
        if self._partitions is None:
            try:
                meta = self.producer.list_topics(self.input_topic, timeout=self.metadata_timeout)
            except KafkaException as exc:
                raise TimeoutError(f"Kafka did not say within {self.metadata_timeout:.0f}s how many partitions "
                                   f"{self.input_topic} has: {exc.args[0].str() if exc.args else exc}") from None
            topic = meta.topics.get(self.input_topic)
            if topic is None or topic.error is not None or not topic.partitions:
                error = topic.error.str() if topic is not None and topic.error is not None else "no partitions"
                raise RuntimeError(f"cannot send to the input topic {self.input_topic}: {error}")
            self._partitions = len(topic.partitions)
        return self._partitions

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err.str()}")

    def _publish(self, key: bytes | str | None, value: bytes | str | None, headers: list) -> None:
        """Produce to the partition of the message's routing key; its Kafka key is carried as it is."""
        partition = partition_of(routing_key_of(headers), self.partitions())
        while True:
            try:
                self.producer.produce(self.input_topic, _as_bytes(value), _as_bytes(key), partition=partition,
                                      headers=headers, on_delivery=self._delivered)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def _headers(self, action: str | None, key, value, topic, when, delay, message_id, headers,
                 ordering_key) -> tuple[str, list]:
        message_id = message_id or str(uuid.uuid4())
        if len(message_id) > MAX_ID_LENGTH:
            raise ValueError(f"message_id is longer than {MAX_ID_LENGTH} characters")
        deadline = resolve_deadline(when, delay, datetime.now(timezone.utc))
        out: list[tuple[str, bytes | None]] = [(HEADER_ID, message_id.encode()),
                                               (HEADER_DEADLINE, format_deadline(deadline).encode())]
        if action:
            out.append((HEADER_ACTION, action.encode()))
        if topic:
            out.append((HEADER_TOPIC, topic.encode()))
        if ordering_key:
            out.append((HEADER_ORDERING_KEY, ordering_key.encode()))
        out.extend((k, _as_bytes(v)) for k, v in (headers or ()))
        return message_id, out

    def send_later(self, key: bytes | str | None, value: bytes | str | None, topic: str | None = None,
                   when: datetime | None = None, delay: timedelta | float | None = None, *,
                   message_id: str | None = None, headers: HeaderList | None = None,
                   ordering_key: str | None = None) -> str:
        """Schedule `value` (with `key`) for `topic` (default: the output topic) at `when` or after `delay`."""
        message_id, hdrs = self._headers(None, key, value, topic, when, delay, message_id, headers, ordering_key)
        self._publish(key, value, hdrs)
        return message_id

    def replace(self, key: bytes | str | None, value: bytes | str | None, topic: str | None = None,
                when: datetime | None = None, delay: timedelta | float | None = None, *,
                message_id: str, headers: HeaderList | None = None, ordering_key: str | None = None) -> str:
        """Replace the waiting message `message_id` (or schedule it if none is waiting)."""
        message_id, hdrs = self._headers("replace", key, value, topic, when, delay, message_id, headers,
                                         ordering_key)
        self._publish(key, value, hdrs)
        return message_id

    def cancel(self, message_id: str, *, ordering_key: str | None = None) -> None:
        """Remove the waiting message `message_id`; unknown or already fired ids are ignored. A message sent
        with an ordering key is cancelled with the same `ordering_key`, which routes the cancel to it."""
        headers = [(HEADER_ID, message_id.encode()), (HEADER_ACTION, b"cancel")]
        if ordering_key:
            headers.append((HEADER_ORDERING_KEY, ordering_key.encode()))
        self._publish(None, None, headers)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every message is acknowledged; raises if any failed."""
        remaining = self.producer.flush(timeout)
        if remaining:
            raise TimeoutError(f"{remaining} messages not acknowledged within {timeout}s")
        if self.errors:
            errors, self.errors = self.errors, []
            raise RuntimeError(f"{len(errors)} messages failed: {errors[0]}")

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()
