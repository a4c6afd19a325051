"""The in-memory twin of the Kafka side: a cluster of topics of partitions (`MemoryKafka`), a producer
whose delivery reports come on `poll`/`flush` (`MemoryProducer`), and consumer-group members
(`MemoryConsumer`) and watchers (`MemoryWatcher`). It implements the Kafka ports (`Publisher`,
`InputConsumer`, `GroupWatcher`) and passes the same contract tests as confluent-kafka on a real
broker (tests/contract/test_kafka_contract.py).

One group per cluster; the partitions of a topic are spread over its members in join order. Kafka can
be made not to answer (`answering = False`: publishes wait unacknowledged, metadata requests fail), and
a member's session can be lost (`MemoryConsumer.lose`, reported to `on_lost` at its next `consume`).
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from chronos.domain.delivery import PURGED_IN_FLIGHT, PURGED_QUEUED, Failure
from chronos.errors import KafkaUnanswered

MAX_MESSAGE_BYTES = 1_000_000  # a value over this is refused, like librdkafka's message.max.bytes


@dataclass(frozen=True)
class MemoryMessage:
    """A message as stored and read (an `InputMessage`)."""

    _topic: str
    _partition: int
    _offset: int
    _key: bytes | None
    _value: bytes | None
    _headers: list | None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list | None:
        return self._headers

    def error(self) -> None:
        return None


@dataclass(frozen=True)
class Lost:
    """A partition a member lost with its session."""

    topic: str
    partition: int


class MemoryKafka:
    """The cluster: topics of partitions, one consumer group's members and committed offsets."""

    def __init__(self, topics: Mapping[str, int] | None = None):
        """`topics`: name -> number of partitions."""
        self.lock = threading.RLock()
        self.partitions: dict[str, list[list[MemoryMessage]]] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.members: list[MemoryConsumer] = []
        self.answering = True
        for name, count in (topics or {}).items():
            self.create_topic(name, count)

    def create_topic(self, name: str, partitions: int) -> None:
        with self.lock:
            self.partitions.setdefault(name, [[] for _ in range(partitions)])

    def append(self, topic: str, key: bytes | None, value: bytes | None, headers: list | None) -> None:
        """Store a message: in the partition of its key (a CRC of it), or the first."""
        with self.lock:
            parts = self.partitions[topic]
            partition = zlib.crc32(key) % len(parts) if key is not None else 0
            parts[partition].append(MemoryMessage(topic, partition, len(parts[partition]), key, value, headers))

    def assignment(self, member: MemoryConsumer) -> list[tuple[str, int]]:
        """The partitions of `member`'s topics it holds: each topic's partitions spread over its members."""
        with self.lock:
            found = []
            for topic in member.topics:
                members = [m for m in self.members if topic in m.topics]
                for partition in range(len(self.partitions.get(topic, []))):
                    if members[partition % len(members)] is member:
                        found.append((topic, partition))
            return found


class MemoryProducer:
    """A `Publisher` on a `MemoryKafka`: `send` queues, `poll`/`flush` store and report (or, while the
    cluster does not answer, leave the publishes waiting); `purge` reports the waiting ones purged."""

    def __init__(self, kafka: MemoryKafka):
        self.kafka = kafka
        self.pending: list[tuple[str, bytes | None, bytes | None, list | None, Callable]] = []
        self.reports: list[tuple[Callable, Any]] = []  # failures found at once, reported at the next poll

    def send(self, topic: str, value: bytes | None, key: bytes | None, headers: list | None,
             on_delivery: Callable) -> None:
        if value is not None and len(value) > MAX_MESSAGE_BYTES:
            on_delivery(Failure("MSG_SIZE_TOO_LARGE", "Broker: Message size too large"), None)
            return
        self.pending.append((topic, value, key, headers, on_delivery))

    def poll(self, timeout: float = -1) -> int:
        reports, self.reports = self.reports, []
        for on_delivery, err in reports:
            on_delivery(err, None)
        if not self.kafka.answering:
            return len(reports)
        pending, self.pending = self.pending, []
        for topic, value, key, headers, on_delivery in pending:
            if topic not in self.kafka.partitions:
                on_delivery(Failure("_UNKNOWN_TOPIC", f"Local: Unknown topic {topic}"), None)
                continue
            self.kafka.append(topic, key, value, headers)
            on_delivery(None, None)
        return len(reports) + len(pending)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return len(self.pending)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        purged = Failure(PURGED_IN_FLIGHT if in_flight else PURGED_QUEUED, "Local: Purged")
        self.reports += [(on_delivery, purged) for *_, on_delivery in self.pending]
        self.pending = []

    def answers(self, timeout: float = 1.0) -> bool:
        return self.kafka.answering

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> dict[str, int]:
        if not self.kafka.answering:
            raise KafkaUnanswered("Kafka does not answer")
        return {name: len(parts) for name, parts in self.kafka.partitions.items()}

    def partitions(self, topic: str, timeout: float = 10.0) -> int | None:
        return self.list_topics(timeout=timeout).get(topic)


class MemoryConsumer:
    """An `InputConsumer` on a `MemoryKafka`: a member of its group once subscribed, reading its
    partitions from the group's committed offsets. A partition paused stays paused until resumed, through
    leaving the group and joining it again, as librdkafka's does."""

    def __init__(self, kafka: MemoryKafka, on_commit: Callable | None = None):
        self.kafka, self.on_commit = kafka, on_commit
        self.topics: list[str] = []
        self.on_lost: Callable | None = None
        self.positions: dict[tuple[str, int], int] = {}
        self.lost: list[Lost] | None = None
        self.paused: set[tuple[str, int]] = set()

    def subscribe(self, topics: list[str], *, on_lost: Callable) -> None:
        with self.kafka.lock:
            self.topics, self.on_lost = list(topics), on_lost
            if self not in self.kafka.members:
                self.kafka.members.append(self)
            self.positions = {}

    def unsubscribe(self) -> None:
        with self.kafka.lock:
            if self in self.kafka.members:
                self.kafka.members.remove(self)
            self.topics, self.positions = [], {}

    def lose(self) -> None:
        """The group's session times out: the member leaves the group, and its next `consume` says so to
        `on_lost` and joins again."""
        with self.kafka.lock:
            self.lost = [Lost(t, p) for t, p in self.kafka.assignment(self)]
            self.kafka.members.remove(self)
            self.positions = {}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[MemoryMessage]:
        with self.kafka.lock:
            if self.lost is not None:
                lost, self.lost = self.lost, None
                if self.on_lost is not None:
                    self.on_lost(self, lost)
                self.kafka.members.append(self)
            read: list[MemoryMessage] = []
            for tp in self.kafka.assignment(self):
                if tp in self.paused:
                    continue
                at = self.positions.get(tp, max(0, self.kafka.committed.get(tp, 0)))
                taken = self.kafka.partitions[tp[0]][tp[1]][at:at + num_messages - len(read)]
                read += taken
                self.positions[tp] = at + len(taken)
            return read

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = False) -> None:
        with self.kafka.lock:
            if not self.kafka.answering:
                raise KafkaUnanswered("the group's coordinator does not answer")
            self.kafka.committed.update(offsets)
        if self.on_commit is not None:
            self.on_commit(None, [Lost(t, p) for t, p in offsets])

    def pause_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        with self.kafka.lock:
            self.paused.update(partitions)

    def resume_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        with self.kafka.lock:
            self.paused.difference_update(partitions)

    def seek_partitions(self, offsets: Mapping[tuple[str, int], int]) -> None:
        with self.kafka.lock:
            self.positions.update(offsets)

    def ends(self) -> dict[int, tuple[int, int]]:
        with self.kafka.lock:
            # a partition not read yet is not known, as the client's before its first fetch
            return {p: (self.positions[(t, p)], len(self.kafka.partitions[t][p])) if (t, p) in self.positions
                    else (-1, -1) for t, p in self.kafka.assignment(self)}

    def close(self) -> None:
        self.unsubscribe()


class MemoryWatcher:
    """A `GroupWatcher` on a `MemoryKafka`."""

    def __init__(self, kafka: MemoryKafka):
        self.kafka = kafka

    def group_progress(self, topic: str, timeout: float) -> dict[int, int] | None:
        with self.kafka.lock:
            if not self.kafka.answering or topic not in self.kafka.partitions:
                return None
            return {p: self.kafka.committed.get((topic, p), -1001) for p in range(len(self.kafka.partitions[topic]))}

    def close(self) -> None:
        pass
