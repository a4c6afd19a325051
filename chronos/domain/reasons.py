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


#: What each code means, for operators (the reference page of the documentation is generated from it).
DESCRIPTIONS: dict[str, str] = {
    BAD_HEADER_NAME: "a header name that is not valid UTF-8 or contains a NUL byte; the dead letter carries it "
                     "escaped (`\\xff\\xfe`, `a\\x00b`), since a Python client could not produce it as it was",
    UNREADABLE_HEADERS: "reading the headers failed in a way Chronos does not expect; the dead letter carries none "
                        "of them, and the consumer logs the error",
    "duplicate_header": "a Chronos header given twice",
    "missing_id": "no `chronosMessageId` header",
    "empty_id": "`chronosMessageId` is empty or null",
    "bad_id": "`chronosMessageId` is not valid UTF-8 or contains NUL",
    "id_too_long": "`chronosMessageId` has more than 128 characters",
    "bad_action": "`chronosAction` is neither `cancel` nor `replace`",
    "missing_deadline": "no `chronosDeadline` header (a cancel needs none)",
    "bad_deadline": "`chronosDeadline` is empty, null, or neither epoch milliseconds nor an ISO-8601 time within "
                    "0001-01-01..9999-12-31 UTC (a leap second, `23:59:60`, is one)",
    "bad_topic": "`chronosTopic` is not a valid Kafka topic name",
    "bad_ordering_key": "`chronosOrderingKey` is not non-empty UTF-8 of at most 256 characters",
    BAD_CRON: "`chronosCron` is not an expression that ever fires, `chronosTimeZone` is not an IANA time zone, or "
              "`chronosDstPolicy` is empty, unknown or without `chronosCron`",
    TOPIC_NOT_ALLOWED: "the destination (`chronosTopic`) does not match `CHRONOS_ALLOWED_TOPICS`, when the message "
                       "arrives or, by the firer, when it fires (the allow-list may have changed since)",
    TOO_LATE: "the deadline is further in the past than `CHRONOS_MAX_LATENESS_MS`",
    STORE_REJECTED: "PostgreSQL refused the row itself (not the connection): retrying the same data cannot help",
    TOO_LARGE: "Kafka refused the message for its size (over the producer's `message.max.bytes`, or the broker's "
               "or topic's limit)",
    PUBLISH_FAILED: "the destination refused the message `CHRONOS_MAX_PUBLISH_ATTEMPTS` times (or, for an already "
                    "late message published by the consumer, for good); the detail names the error and the attempts",
}


def code_of(reason_text: str) -> str:
    """The code of a reason (the text before the first colon)."""
    return reason_text.split(":", 1)[0]
