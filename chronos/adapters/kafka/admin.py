"""Kafka's admin side: is the cluster reachable, and the topics Chronos needs created."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from chronos.adapters.kafka.clients import CONSUMER_ONLY, PRODUCER_ONLY, REFUSED_CONNECTION, error_text
from chronos.errors import ConfigError, KafkaRefused, UnavailableError

log = logging.getLogger("chronos.kafka")
_ADMIN_LOG = logging.getLogger("chronos.kafka.admin")


def admin_client(bootstrap: str, extra: dict[str, Any] | None = None, *, logger: logging.Logger = _ADMIN_LOG,
                 error_cb: Callable[[KafkaError], None] | None = None, secrets: list[str] | None = None,
                 what: str | None = None) -> AdminClient:
    """An admin client for `bootstrap` with the client properties an admin client accepts (TLS, SASL, ...)
    of `extra`, consumer- and producer-only ones left out. Reconnects quickly: it is used to wait for a
    broker that is starting. A one-line ConfigError if librdkafka refuses the settings."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": 5000,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 500,
        **{k: v for k, v in (extra or {}).items() if k not in CONSUMER_ONLY and k not in PRODUCER_ONLY},
        "logger": logger,
        "error_cb": error_cb or (lambda err: logger.debug("admin client: %s", err)),
    }
    try:
        return AdminClient(conf)
    except KafkaException as exc:
        whose = f" of the {what}" if what else ""
        raise ConfigError(f"Kafka settings{whose} are not valid: {error_text(exc, secrets or [])}") from None


def probe(bootstrap: str, extra: dict[str, Any], timeout: float = 10.0, secrets: list[str] | None = None,
          what: str | None = None) -> str | None:
    """Ask Kafka for metadata until it answers or `timeout` seconds pass: None once it answered, else what
    went wrong last. KafkaRefused at once when the broker refuses this client's TLS or SASL settings (or
    this client the broker's certificate); ConfigError if librdkafka refuses the settings. Quiet: the
    reconnect attempts are not printed."""
    quiet = logging.getLogger("chronos.kafka.check")
    quiet.propagate = False
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    errors: list[KafkaError] = []
    admin = admin_client(bootstrap, extra, logger=quiet, error_cb=errors.append, secrets=secrets, what=what)
    deadline = time.monotonic() + timeout
    while True:
        try:
            # short requests, so that a refused handshake ends the wait as soon as it is reported
            admin.list_topics(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
            return None
        except KafkaException as exc:
            reason = error_text(exc, secrets or [])
        admin.poll(0)  # serves error_cb
        for err in errors:
            if err.code() in REFUSED_CONNECTION:
                raise KafkaRefused(f"Kafka at {bootstrap} refused the connection: "
                                   f"{error_text(KafkaException(err), secrets or [])}")
        if errors:
            reason = error_text(KafkaException(errors[-1]), secrets or [])
        if time.monotonic() >= deadline:
            return reason


def check_reachable(bootstrap: str, extra: dict[str, Any], timeout: float = 10.0,
                    secrets: list[str] | None = None) -> None:
    """Raise UnavailableError unless Kafka answers a metadata request within `timeout` seconds
    (KafkaRefused, a ConfigError, at once if it refuses this client's TLS or SASL settings)."""
    reason = probe(bootstrap, extra, timeout, secrets)
    if reason is not None:
        raise UnavailableError(f"cannot reach Kafka at {bootstrap} within {timeout:.0f}s: {reason}")


def create_topics(bootstrap_servers: str, topics: dict[str, int], config: dict | None = None,
                  timeout: float = 30, client_config: dict | None = None) -> None:
    """Create the topics (name -> partition count) that are missing, then wait until all of
    them are visible in the cluster metadata. An existing topic is left as it is (a warning is
    logged if its partition count differs). UnavailableError if Kafka does not answer or refuses."""
    for name, partitions in topics.items():
        if not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"topic {name!r}: partition count must be a positive int, "
                             f"not {partitions!r}")
    if not topics:
        return
    deadline = time.monotonic() + timeout
    topic_config = {str(k): str(v) for k, v in (config or {}).items()}
    admin = admin_client(bootstrap_servers, client_config)

    def remaining() -> float:
        return max(0.1, deadline - time.monotonic())

    def metadata():
        try:
            return admin.list_topics(timeout=min(remaining(), 10))
        except KafkaException as e:
            raise UnavailableError(f"cannot read metadata from {bootstrap_servers}: {e}") from None

    existing = metadata().topics
    # replication_factor -1: the broker's default (1 on a single-node broker)
    missing = [NewTopic(name, num_partitions=n, config=topic_config)
               for name, n in topics.items() if name not in existing]
    if missing:
        log.info("creating topics %s", ", ".join(t.topic for t in missing))
        op_timeout = min(remaining(), 60.0)
        futures = admin.create_topics(missing, operation_timeout=op_timeout,
                                      request_timeout=op_timeout)
        for name, fut in futures.items():
            try:
                fut.result(timeout=remaining())
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise UnavailableError(f"cannot create topic {name!r}: {e}") from None
            except Exception as e:  # e.g. concurrent.futures.TimeoutError
                raise UnavailableError(f"cannot create topic {name!r}: {e!r}") from None
    while True:
        md = metadata().topics
        pending = [n for n in topics if n not in md or md[n].error is not None
                   or not md[n].partitions]
        if not pending:
            break
        if time.monotonic() >= deadline:
            raise UnavailableError(f"topics {', '.join(pending)} did not appear in the metadata "
                                   f"of {bootstrap_servers} within {timeout}s")
        time.sleep(0.05)
    for name, n in topics.items():
        have = len(md[name].partitions)
        if have != n:
            log.warning("topic %s has %s partitions, not the %s asked for", name, have, n)


def partition_count(bootstrap_servers: str, topic: str, client_config: dict | None = None, timeout: float = 10) -> int:
    """How many partitions `topic` has (0 when Kafka does not know it); UnavailableError if Kafka does not answer.
    Asks for every topic's metadata: asking for one would let the cluster create it."""
    admin = admin_client(bootstrap_servers, client_config)
    try:
        found = admin.list_topics(timeout=timeout).topics.get(topic)
    except KafkaException as e:
        raise UnavailableError(f"cannot read metadata from {bootstrap_servers}: {e}") from None
    return 0 if found is None or found.error is not None else len(found.partitions)


@dataclass(frozen=True)
class BrokerOffsets:
    """What a broker holds, from its offsets: per (topic, partition) the start and end offsets, the
    committed offsets of one consumer group on one topic, and whether every end offset is exact."""

    ends: dict[tuple[str, int], tuple[int, int]]
    committed: dict[tuple[str, int], int]
    exact: bool

    @property
    def messages(self) -> int:
        """Messages held on all topics: end minus start offset, summed."""
        return sum(max(0, end - start) for start, end in self.ends.values())

    def unread(self, topic: str) -> int:
        """Messages of `topic` past the group's committed offsets (from the start where it committed none)."""
        return sum(max(0, end - self.committed.get(tp, start)) for tp, (start, end) in self.ends.items()
                   if tp[0] == topic)


class OffsetReader:
    """Reads a broker's start, end and committed offsets (`read`), cheaply enough to be asked every few seconds.

    A broker may answer a ListOffsets(latest) with the base offset of its last stored batch + 1 (the
    embedded broker does): end offsets are taken instead from the high watermark of a fetch of each
    partition's last batch, which is right. A partition whose fetch gets no answer in time keeps the
    listed end offset, and the result is not `exact` (its ends are then at least the listed ones).
    The reader never joins the group: it only asks for the group's committed offsets.
    """

    def __init__(self, bootstrap: str, group: str, topic: str, extra: dict[str, Any] | None = None,
                 timeout: float = 2.0, secrets: list[str] | None = None):
        from confluent_kafka import Consumer, TopicPartition
        self._partition = TopicPartition
        self.topic, self.timeout, self.secrets = topic, timeout, secrets or []
        quiet = logging.getLogger("chronos.kafka.offsets")
        quiet.propagate = False
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
        conf: dict[str, Any] = {
            **{k: v for k, v in (extra or {}).items() if k not in PRODUCER_ONLY and k not in CONSUMER_ONLY},
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": "false",
            "enable.partition.eof": "false", "fetch.wait.max.ms": "100", "socket.connection.setup.timeout.ms": 2000,
            "reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 1000,
            # an outage is the watcher's to report, not every reconnect attempt of this client's
            "logger": quiet, "error_cb": lambda err: quiet.debug("offset reader: %s", err),
        }
        try:
            self.consumer = Consumer(conf)
        except KafkaException as exc:
            raise ConfigError(f"Kafka settings are not valid: {error_text(exc, self.secrets)}") from None

    def read(self) -> BrokerOffsets:
        """Offsets of every topic now. UnavailableError if the broker does not answer."""
        try:
            md = self.consumer.list_topics(timeout=self.timeout)
            ends: dict[tuple[str, int], tuple[int, int]] = {}
            for name, topic in md.topics.items():
                if topic.error is not None or name.startswith("__"):
                    continue
                for p in topic.partitions:
                    low, high = self.consumer.get_watermark_offsets(self._partition(name, p), timeout=self.timeout)
                    ends[(name, p)] = (low, high)
            exact = self._exact_ends(ends)
            mine = [self._partition(t, p) for t, p in ends if t == self.topic]
            committed = {(tp.topic, tp.partition): tp.offset for tp in
                         (self.consumer.committed(mine, timeout=self.timeout) if mine else []) if tp.offset >= 0}
        except KafkaException as exc:
            raise UnavailableError(f"cannot read the broker's offsets: {error_text(exc, self.secrets)}") from None
        return BrokerOffsets(ends, committed, exact)

    def _exact_ends(self, ends: dict[tuple[str, int], tuple[int, int]]) -> bool:
        """Fetch the last batch of every non-empty partition and take the fetch's high watermark as its
        end (in place in `ends`). True when every partition answered."""
        todo = {tp for tp, (low, high) in ends.items() if high > low}
        if not todo:
            return True
        self.consumer.assign([self._partition(t, p, ends[(t, p)][1] - 1) for t, p in todo])
        deadline = time.monotonic() + self.timeout
        try:
            while todo and time.monotonic() < deadline:
                for msg in self.consumer.consume(num_messages=1000, timeout=min(0.2, self.timeout)):
                    tp = (str(msg.topic()), int(msg.partition() or 0))
                    if msg.error() is None and tp in todo:
                        todo.discard(tp)
                        low, high = self.consumer.get_watermark_offsets(self._partition(*tp), cached=True)
                        ends[tp] = (ends[tp][0], max(high, ends[tp][1]))
        finally:
            self.consumer.unassign()
        return not todo

    def close(self) -> None:
        self.consumer.close()
