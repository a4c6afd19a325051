"""Fire-rate limit settings: the format, which rate a topic gets (bad values: test_config.py)."""

from __future__ import annotations


import pytest

from chronos import config
from chronos.domain.ratelimit import capacity
from helpers import settings


def test_no_limit_by_default():
    assert not settings().fire_rates
    assert settings().fire_rates.rate_for("chronos.output") is None


def test_rates_per_topic_pattern_and_default():
    s = settings({"CHRONOS_FIRE_RATE_LIMITS": "orders=500, pay.*=120/min,audit=unlimited,*.eu=2.5",
              "CHRONOS_FIRE_RATE_DEFAULT": "36/h"})
    rates = s.fire_rates
    assert rates
    assert rates.rate_for("orders") == 500
    assert rates.rate_for("pay.eu") == 2.0          # the first matching pattern, in the order given
    assert rates.rate_for("shop.eu") == 2.5
    assert rates.rate_for("audit") is None          # exempt from the default
    assert rates.rate_for("chronos.output") == pytest.approx(0.01)
    assert rates.rate_for("ordersX") == pytest.approx(0.01)  # a name without * matches exactly


def test_an_exact_name_wins_over_an_earlier_pattern():
    rates = settings({"CHRONOS_FIRE_RATE_LIMITS": "pay.*=1,pay.eu=9"}).fire_rates
    assert (rates.rate_for("pay.eu"), rates.rate_for("pay.us")) == (9, 1)


def test_flag_and_round_trip_through_the_environment_of_child_processes():
    s = settings(argv=["--fire-rate-limits", "orders=100/min,audit=unlimited", "--fire-rate-default", "50"])
    again = settings(config.to_environ(s))
    assert again.fire_rates == s.fire_rates
    assert again.fire_rates.rate_for("x") == 50


def test_a_bucket_holds_one_second_of_its_rate_and_at_least_one_message():
    assert capacity(500) == 500 and capacity(0.01) == 1


def test_status_shows_the_throttled_backlog_per_topic():
    from datetime import datetime, timezone

    from chronos.ops import status
    from chronos.domain.model import Overview, Throttled
    at = datetime(2026, 11, 21, 9, 0, 5, tzinfo=timezone.utc)
    view = Overview.build(at, None, None, 0, 0, 0, [], None)
    d = status.to_dict(view, 5000, [Throttled("orders", 50.0, 1200, 12.5), Throttled("audit", 0.5, 0, 0.0)])
    assert d["throttled"] == [{"topic": "orders", "rate_per_s": 50.0, "rows": 1200, "lateness_s": 12.5},
                              {"topic": "audit", "rate_per_s": 0.5, "rows": 0, "lateness_s": 0.0}]
    text = status.render(d)
    assert "  throttled orders           1,200   due, held back by the limit 50/s, oldest 12.500s late" in text
    assert "  throttled audit                0   limit 0.5/s, nothing held back" in text


def test_throttled_gauges_per_topic_and_a_drained_topic_drops_out():
    import uuid

    from chronos.telemetry import metrics as telemetry
    from chronos.config import Settings
    from chronos.domain.model import Throttled
    d = telemetry.DetectorTelemetry(uuid.uuid4(), Settings())
    d.throttled_gauges([Throttled("orders", 50.0, 7, 3.0), Throttled("audit", 1.0, 2, 1.0)])
    d.throttled_gauges([Throttled("orders", 50.0, 5, 2.0)])
    samples = {(s.name, s.labels["topic"]): s.value for f in d.registry.collect()
               if f.name.startswith("chronos_throttled") for s in f.samples}
    assert samples == {("chronos_throttled_rows", "orders"): 5, ("chronos_throttled_lateness_seconds", "orders"): 2.0}
