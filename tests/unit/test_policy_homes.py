"""Policies with one home each: the rules from settings, the dead-letter reason codes, the topic name."""

from __future__ import annotations

import re

import pytest
from confluent_kafka import KafkaError

from chronos import codec
from chronos.domain.delivery import failure_reason
from chronos.config import ConfigError, load
from chronos.domain import reasons
from chronos.domain.intake import Rules, Verdict, decide
from chronos.domain.ratelimit import parse_topic_rates
from chronos.codec.topics import is_topic_name

NOW = 1_800_000_000_000_000


def test_rules_from_settings_carry_the_advance_the_output_topic_the_allow_list_and_the_lateness_limit():
    rules = Rules.from_settings(load(environ={"CHRONOS_TIMING_ADVANCE_MS": "70", "CHRONOS_OUTPUT_TOPIC": "out",
                                              "CHRONOS_MAX_LATENESS_MS": "1500"}))
    assert rules == Rules(timing_advance_us=70_000, output_topic="out", allowed_topics=re.compile(re.escape("out")),
                          max_lateness_us=1_500_000)
    assert Rules.from_settings(load(environ={})).max_lateness_us is None
    allowed = Rules.from_settings(load(environ={"CHRONOS_ALLOWED_TOPICS": r"billing\..*"})).allowed_topics
    assert allowed.fullmatch("billing.eu") and not allowed.fullmatch("payments")


def _parsed(**kw) -> codec.Parsed:
    base = dict(error=None, message_id="m", deadline_us=NOW + 10_000_000, topic=None, ordering_key=None,
                action=None, cron=None, timezone=None, headers=[])
    return codec.Parsed(**{**base, **kw})


def test_every_reason_the_consumer_can_give_is_counted_from_the_start():
    rules = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile("out"),
                  max_lateness_us=1_000)
    given = [decide(_parsed(topic="elsewhere"), NOW, rules).reason,
             decide(_parsed(cron="not a cron"), NOW, rules).reason,
             decide(_parsed(timezone="Europe/Paris"), NOW, rules).reason,
             decide(_parsed(dst_policy="skip"), NOW, rules).reason,
             decide(_parsed(deadline_us=NOW - 10_000_000), NOW, rules).reason,
             failure_reason(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
             failure_reason(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))]
    assert all(r is not None for r in given)
    codes = {reasons.code_of(r) for r in given if r is not None}
    assert codes <= set(reasons.CONSUMER_REASONS)
    assert set(codec.REASON_CODES) <= set(reasons.CONSUMER_REASONS)
    assert set(reasons.FIRER_REASONS) <= set(reasons.CONSUMER_REASONS)
    assert len(set(reasons.CONSUMER_REASONS)) == len(reasons.CONSUMER_REASONS)
    assert decide(_parsed(), NOW, rules).verdict is Verdict.ENQUEUE


@pytest.mark.parametrize("name,ok", [
    ("orders", True), ("a.b_c-D9", True), ("x" * 249, True),
    ("", False), (".", False), ("..", False), ("x" * 250, False), ("bad topic", False), ("orders\n", False),
    ("örders", False), ("a*", False),
])
def test_one_topic_name_rule_for_the_settings_the_header_codec_and_the_rate_patterns(name, ok):
    assert is_topic_name(name) is ok
    try:
        load(environ={"CHRONOS_OUTPUT_TOPIC": name})
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted is ok
    parsed = codec.parse_headers([("chronosMessageId", b"m"), ("chronosDeadline", b"1000"),
                                  ("chronosTopic", name.encode())])
    assert (parsed.error is None) is ok
    if ok:  # every topic name is also a fire-rate pattern (which may add *)
        assert parse_topic_rates("CHRONOS_FIRE_RATE_LIMITS", f"{name}=10").entries
