"""Publish failures: how an error is classified, the reason a dead letter carries, the retry backoff."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from chronos import codec
from chronos.domain.delivery import (PERMANENT_FAILURE, PRODUCER_FAILURE, REFUSED, UNANSWERED_FAILURE, classify,
                                     failure_reason)
from chronos.roles.firer.decisions import retry_delay_ms
from chronos.roles.firer.sender import iso_us


@pytest.mark.parametrize("code,kind", [
    (KafkaError.MSG_SIZE_TOO_LARGE, PERMANENT_FAILURE),       # producer's message.max.bytes, or the broker's
    (KafkaError.RECORD_LIST_TOO_LARGE, PERMANENT_FAILURE),
    (KafkaError.INVALID_RECORD, PERMANENT_FAILURE),
    (KafkaError.TOPIC_EXCEPTION, REFUSED),                   # a topic name the broker refuses
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, REFUSED),        # permissions can be granted
    (KafkaError.UNKNOWN_TOPIC_OR_PART, REFUSED),             # a topic can be created
    (KafkaError._MSG_TIMED_OUT, UNANSWERED_FAILURE),         # Kafka did not answer: says nothing of the message
    (KafkaError._TRANSPORT, UNANSWERED_FAILURE),
])
def test_errors_are_classified(code, kind):
    assert classify(KafkaError(code)) == kind


def test_a_fatal_error_is_not_the_message_s_fault():
    assert classify(KafkaError(KafkaError._FATAL, "fatal", fatal=True)) == PRODUCER_FAILURE


def test_failure_reasons_name_the_size_or_the_error():
    assert failure_reason(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too big")).startswith(
        "too_large: MSG_SIZE_TOO_LARGE: ")
    assert failure_reason(KafkaError(KafkaError.TOPIC_EXCEPTION)).startswith("publish_failed: TOPIC_EXCEPTION: ")


def test_retry_delay_doubles_up_to_a_cap():
    delays = [retry_delay_ms(n) for n in range(12)]
    assert delays[:4] == [1000, 2000, 4000, 8000]
    assert all(a <= b for a, b in zip(delays, delays[1:]))
    assert max(delays) == 60_000
    assert retry_delay_ms(10_000) == 60_000  # no overflow however many attempts


def test_dead_letter_deadline_is_exact_and_readable_by_the_consumer():
    us = 253402300799999999  # 9999-12-31T23:59:59.999999Z
    assert iso_us(us) == "9999-12-31T23:59:59.999999Z"
    parsed = codec.parse_headers([("chronosMessageId", b"x"), ("chronosDeadline", iso_us(1_700_000_000_123_456).encode())])
    assert parsed.error is None and parsed.deadline_us == 1_700_000_000_123_456
