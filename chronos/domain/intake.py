"""What the consumer does with one input message: a pure decision, `now` passed in."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Protocol

from chronos.domain import cron
from chronos.domain.reasons import BAD_CRON, TOO_LATE, TOPIC_NOT_ALLOWED
from chronos.codec import Parsed


class IntakeSettings(Protocol):
    """The settings the rules come from (chronos.config.Settings has them; the domain does not import it)."""

    @property
    def timing_advance_ms(self) -> int: ...
    @property
    def output_topic(self) -> str: ...
    @property
    def allowed_topics_re(self) -> re.Pattern[str]: ...
    @property
    def max_lateness_ms(self) -> int | None: ...


class Verdict(enum.Enum):
    INVALID = "invalid"      # dead-letter topic, with a reason
    LATE = "late"            # publish at once (unless the id is waiting)
    ENQUEUE = "enqueue"      # store until the deadline (a recurring schedule: until its first occurrence)
    CANCEL = "cancel"        # delete the waiting message or schedule with this id


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str | None = None
    deadline_us: int | None = None   # when to fire (for a schedule: its first occurrence)
    replace: bool = False            # chronosAction: replace


@dataclass(frozen=True, slots=True)
class Rules:
    timing_advance_us: int
    output_topic: str
    allowed_topics: re.Pattern[str]
    max_lateness_us: int | None = None

    @classmethod
    def from_settings(cls, settings: IntakeSettings) -> Rules:
        """The rules a deployment's settings give (the consumer's and the bulk pipeline's alike)."""
        return cls(timing_advance_us=settings.timing_advance_ms * 1000, output_topic=settings.output_topic,
                   allowed_topics=settings.allowed_topics_re,
                   max_lateness_us=None if settings.max_lateness_ms is None else settings.max_lateness_ms * 1000)


def decide(parsed: Parsed, now_us: int, rules: Rules) -> Decision:
    if parsed.error is not None:
        return Decision(Verdict.INVALID, parsed.error)
    if parsed.topic is not None and parsed.topic != rules.output_topic \
            and not rules.allowed_topics.fullmatch(parsed.topic):
        return Decision(Verdict.INVALID, f"{TOPIC_NOT_ALLOWED}: {parsed.topic!r} does not match CHRONOS_ALLOWED_TOPICS")
    if parsed.action == "cancel":
        return Decision(Verdict.CANCEL)
    replace = parsed.action == "replace"
    if parsed.cron is not None:
        try:
            first = cron.first_occurrence(parsed.cron, parsed.timezone, parsed.deadline_us, now_us, parsed.dst_policy)
        except cron.CronError as exc:
            return Decision(Verdict.INVALID, f"{BAD_CRON}: {exc}")
        return Decision(Verdict.ENQUEUE, deadline_us=first, replace=replace)
    if parsed.timezone is not None:
        return Decision(Verdict.INVALID, f"{BAD_CRON}: chronosTimeZone without chronosCron")
    if parsed.dst_policy is not None:
        return Decision(Verdict.INVALID, f"{BAD_CRON}: chronosDstPolicy without chronosCron")
    deadline = parsed.deadline_us
    assert deadline is not None
    if rules.max_lateness_us is not None and now_us - deadline > rules.max_lateness_us:
        return Decision(Verdict.INVALID, f"{TOO_LATE}: deadline is {(now_us - deadline) // 1000} ms in the past, "
                                         f"more than CHRONOS_MAX_LATENESS_MS")
    if deadline <= now_us + rules.timing_advance_us:
        return Decision(Verdict.LATE, deadline_us=deadline, replace=replace)
    return Decision(Verdict.ENQUEUE, deadline_us=deadline, replace=replace)
