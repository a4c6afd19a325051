"""The one outage reporter every process uses for PostgreSQL: backoff delays and its log lines."""

from __future__ import annotations

import logging

import pytest

from chronos.errors import StoreUnavailable
from chronos.runtime.backoff import Outage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_back_off_exponentially_up_to_the_cap_and_success_resets(caplog):
    clock = Clock()
    outage = Outage(logging.getLogger("chronos.test"), first=0.5, cap=3.0, clock=clock)
    caplog.set_level("WARNING", logger="chronos.test")
    assert [outage.failed(StoreUnavailable("refused")) for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    clock.now += 7.25
    assert outage.down_for() == pytest.approx(7.25)
    outage.ok()
    assert outage.down_for() == 0.0
    assert outage.failed(StoreUnavailable("refused")) == 0.5  # a new outage starts from the first delay
    clock.now += 10.0
    outage.failed(StoreUnavailable("refused"))
    messages = [r.getMessage() for r in caplog.records]
    # repeats within the throttle's interval (10 s) are counted, not printed one by one
    assert messages == ["postgres unavailable (refused); retrying in 0.5s",
                        "postgres reachable again after 7.2s",
                        "postgres unavailable (refused); retrying in 1.0s (and 5 more like it)"]


def test_success_without_an_outage_logs_nothing(caplog):
    outage = Outage(logging.getLogger("chronos.test"))
    caplog.set_level("DEBUG", logger="chronos.test")
    outage.ok()
    assert not caplog.records and outage.down_for() == 0.0
