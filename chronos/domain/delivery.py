"""What a failed publish means, what becomes of its message (`after_failure`, the one failure policy
of the consumer's late messages and the firer's rows alike), and the dead letter it makes.

A failed publish comes back as a `DeliveryError`: what the Kafka adapter hands over (confluent-kafka's
`KafkaError` is one as it is; the in-memory twin makes `Failure`s). It is classified by its error's
name (librdkafka's, `MSG_SIZE_TOO_LARGE`, `_MSG_TIMED_OUT`, ...) and whether the client calls it fatal,
so that nothing here depends on a client library.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from chronos.domain.reasons import PUBLISH_FAILED, TOO_LARGE


class DeliveryError(Protocol):
    """Why a publish (or a read) failed, as the Kafka client says it."""

    def name(self) -> str:
        """The error's name: librdkafka's, as `KafkaError.name()` gives it (`_MSG_TIMED_OUT`)."""
        ...

    def str(self) -> str:
        """The error in words."""
        ...

    def fatal(self) -> bool:
        """Whether the client that reported it can go on (False) or must be replaced (True)."""
        ...


@dataclass(frozen=True)
class Failure:
    """A `DeliveryError` made by Chronos itself rather than a client: a publish a replaced producer
    never reported, one the in-memory twin fails."""

    error_name: str
    text: str = ""
    is_fatal: bool = False

    def name(self) -> str:
        return self.error_name

    def str(self) -> str:
        return self.text or self.error_name

    def fatal(self) -> bool:
        return self.is_fatal


# A read that reached the end of a partition: not an error (only with enable.partition.eof).
PARTITION_EOF = "_PARTITION_EOF"
# A publish purged before it was acknowledged, queued or in flight (the producer was replaced).
PURGED_QUEUED, PURGED_IN_FLIGHT = "_PURGE_QUEUE", "_PURGE_INFLIGHT"

# Refusals that no retry can change: the message is too large or malformed for the producer or the
# broker.
SIZE_ERRORS = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"})
PERMANENT = SIZE_ERRORS | {"INVALID_RECORD"}
# Refusals about the message's topic that may pass: an invalid or unknown topic, a denied write, a
# partition without enough replicas. Retried a bounded number of times, since a topic can be created
# and a permission granted.
TOPIC_REFUSALS = frozenset({
    "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "TOPIC_EXCEPTION", "TOPIC_AUTHORIZATION_FAILED",
    "POLICY_VIOLATION", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "INVALID_TIMESTAMP",
    "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION", "KAFKA_STORAGE_ERROR", "_INVALID_ARG"})
# Failures that say nothing about the message: Kafka did not answer in time (an outage). The firer
# already stops claiming while acknowledgements stall, so these are handed back, not counted.
UNANSWERED = frozenset({"_MSG_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", PURGED_QUEUED,
                        PURGED_IN_FLIGHT})
# Failures about the producer's own identity or state at the broker, whatever the message: fenced
# (a broker that lost track of a topic's producers fences them all: seen when a topic was deleted and
# created again), an epoch or producer id it no longer knows (a broker restarted), a broken sequence,
# no permission to write idempotently. The producer is replaced and the message handed back uncounted.
PRODUCER_STATE = frozenset({
    "PRODUCER_FENCED", "_FENCED", "INVALID_PRODUCER_EPOCH", "UNKNOWN_PRODUCER_ID", "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "DUPLICATE_SEQUENCE_NUMBER", "INVALID_PRODUCER_ID_MAPPING", "CLUSTER_AUTHORIZATION_FAILED", "_FATAL",
    "_INCONSISTENT", "_GAPLESS_GUARANTEE", "_STATE"})

PERMANENT_FAILURE, REFUSED, UNANSWERED_FAILURE = "permanent", "refused", "unanswered"
PRODUCER_FAILURE, UNCLEAR_FAILURE = "producer", "unclear"


def classify(err: DeliveryError) -> str:
    """What a failed publish means, from its error alone:

    - `permanent`: the message can never be published (dead-letter it now);
    - `refused`: its topic refuses it for a reason that may pass (retry with backoff, a bounded number
      of times);
    - `unanswered`: Kafka did not answer (an outage: hand it back, it says nothing about the message);
    - `producer`: the producer itself is at fault (replace it, hand the message back uncounted);
    - `unclear`: any other error (`ProducerWatch` decides: the producer's fault unless it was
      acknowledged lately)."""
    name = err.name()
    if name in PERMANENT:
        return PERMANENT_FAILURE
    if name in UNANSWERED:
        return UNANSWERED_FAILURE
    if name in PRODUCER_STATE or err.fatal():
        return PRODUCER_FAILURE
    if name in TOPIC_REFUSALS:
        return REFUSED
    return UNCLEAR_FAILURE


def failure_reason(err: DeliveryError) -> str:
    """The dead-letter reason for a publish that failed with `err`: `<reason>: <detail>`."""
    code = TOO_LARGE if err.name() in SIZE_ERRORS else PUBLISH_FAILED
    return f"{code}: {err.name()}: {err.str()}"


class AfterFailure(enum.Enum):
    """What becomes of a message whose publish failed."""

    RELEASE = "release"  # handed back as it is: the failure says nothing about the message
    RETRY = "retry"      # published again after a backoff
    DEAD = "dead"        # to the dead-letter topic
    PARK = "park"        # a dead letter the dead-letter topic refuses for good: kept in PostgreSQL


def after_failure(kind: str, failures: int = 1, max_attempts: int | None = None, *,
                  dead_letter: bool = False) -> AfterFailure:
    """What to do with a message whose publish failed (`kind` from `ProducerWatch.failed`; `failures`
    counts this one): a message refused for good is dead-lettered, or parked when it was a dead letter
    already; Kafka not answering, or the producer itself at fault, says nothing about the message, which
    is handed back as it is; a refusal that may pass is retried after a backoff, until `max_attempts`
    publishes have failed (never, without it; a dead letter is retried for as long as it takes)."""
    if kind == PERMANENT_FAILURE:
        return AfterFailure.PARK if dead_letter else AfterFailure.DEAD
    if kind in (UNANSWERED_FAILURE, PRODUCER_FAILURE):
        return AfterFailure.RELEASE
    if not dead_letter and max_attempts is not None and failures >= max_attempts:
        return AfterFailure.DEAD
    return AfterFailure.RETRY


ERROR_HEADER = "chronosError"
SOURCE_HEADER = "chronosSource"


def dead_letter_headers(headers: list, reason: str, source: str) -> list:
    """A dead letter's headers: the message's own, then `chronosError: <reason>: <detail>` and
    `chronosSource` (`<topic>/<partition>/<offset>` of the input, or `store/<id>`)."""
    return [*headers, (ERROR_HEADER, reason.encode()), (SOURCE_HEADER, source.encode())]
