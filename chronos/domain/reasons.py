"""Why a message went to the dead-letter topic: the reason codes.

A dead letter's `chronosError` header reads `<code>: <detail>`; the code is also the `reason`
label of `chronos_messages_dead_lettered_total`. The header codec owns the codes of its own
checks (`chronos.codec.REASON_CODES`, in their priority order); the others are here.
"""

from __future__ import annotations

from chronos.codec import REASON_CODES as HEADER_REASONS

BAD_HEADER_NAME = "bad_header_name"        # a header name the Python client cannot carry (read_headers)
UNREADABLE_HEADERS = "unreadable_headers"  # reading the headers failed altogether
BAD_CRON = "bad_cron"                      # a cron expression, time zone or DST policy the domain refuses
TOPIC_NOT_ALLOWED = "topic_not_allowed"    # chronosTopic outside CHRONOS_ALLOWED_TOPICS
TOO_LATE = "too_late"                      # deadline further in the past than CHRONOS_MAX_LATENESS_MS
STORE_REJECTED = "store_rejected"          # PostgreSQL refused the row itself
TOO_LARGE = "too_large"                    # Kafka refused the message for its size
PUBLISH_FAILED = "publish_failed"          # Kafka kept refusing it

# What the consumer may dead-letter, and what the firer may: a stored message whose publish failed
# for good, or whose destination the allow-list no longer allows.
CONSUMER_REASONS = (BAD_HEADER_NAME, UNREADABLE_HEADERS, *HEADER_REASONS, TOPIC_NOT_ALLOWED, TOO_LATE,
                    STORE_REJECTED, TOO_LARGE, PUBLISH_FAILED)
FIRER_REASONS = (TOO_LARGE, PUBLISH_FAILED, TOPIC_NOT_ALLOWED)


def code_of(reason_text: str) -> str:
    """The code of a reason (the text before the first colon)."""
    return reason_text.split(":", 1)[0]
