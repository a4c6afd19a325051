"""The firer's threads, built with their adapters as arguments: a store double and a Kafka double."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import pytest

from chronos.domain.model import Claimed
from chronos.ops.metrics import FirerTelemetry
from chronos.roles.firer import IDLE_WAIT, SLOW_STATEMENT, TICK, FirerProcess, Outcomes
from chronos.runtime.process import Lifecycle
from kafka_double import FakePublisher, settings


class NoStore:
    """A store for tests that must not reach it."""

    node_id = None
    last_ok = 0.0

    def close(self):
        pass

    def cancel(self):
        pass

    def __getattr__(self, name):
        raise AssertionError(f"the store was asked to {name}")


def firer(store_factory=NoStore, publisher=None, **env) -> FirerProcess:
    s = settings(**env)
    return FirerProcess(s, Lifecycle(), stores=store_factory, producers=(publisher or FakePublisher()).factory(),
                        telemetry=FirerTelemetry(uuid.uuid4(), s))


def claimed(mid: str, deadline_s: float) -> Claimed:
    return Claimed(mid, int(deadline_s * 1e6), None, b"k", mid.encode(), None, datetime.now(timezone.utc))


def test_publishing_loop_sleeps_at_least_a_tick_between_close_deadlines():
    proc = firer()
    proc.claimed.put([claimed("a", time.time() + proc.timing.advance + 0.0003)])  # due 0.3 ms from now
    proc.take_claimed()
    assert proc.wait_time() >= TICK
    proc = firer()
    proc.claimed.put([claimed("a", time.time() + 0.5)])
    proc.take_claimed()
    assert proc.wait_time() == IDLE_WAIT


def test_settling_thread_waits_out_a_postgres_outage_instead_of_spinning():
    settler = firer().settler
    settler.down_until = time.time() + 0.8
    settler.next_clock_sync = time.time() + 60
    settler.inbox.put(Outcomes(acked=[claimed("a", 0)]))
    settler.inbox.put(Outcomes(release=[claimed("b", 0)]))
    settler.receive(0)
    assert settler.wait_time() > 0.5
    settler.down_until = 0.0
    assert settler.wait_time() == 0.0  # reachable again: hand back at once


def test_claiming_stops_while_the_oldest_publish_waits_too_long_for_kafka():
    """Acknowledgements still trickle in (an overloaded broker), but the oldest publish has waited
    past half the hold time: claiming more would only have rows handed to a peer and published twice."""
    proc = firer(CHRONOS_HOLD_TIME_MS="5000")
    shared, now = proc.shared, time.monotonic()
    for sent in (now - 4.0, now - 0.1, now):
        shared.sending(sent)
    shared.ack_progress = now  # an acknowledgement just came back
    proc.claimer.claim(time.time())  # NoStore: claiming would fail the test
    assert proc.claimer.claims_paused
    assert shared.stalled(now) == pytest.approx(4.0)
    shared.delivered()  # acknowledged: the oldest in flight is now 0.1 s old
    assert shared.stalled(now) == pytest.approx(0.1)


def test_a_claim_or_delete_slow_enough_to_hold_up_firing_is_logged(caplog):
    recorded = []
    proc = firer()
    proc.metrics.batch = lambda *a: recorded.append(a[:2])
    caplog.set_level("WARNING", logger="chronos.firer")
    proc.settler.measured("delete", 1000, time.perf_counter())
    assert not caplog.records
    proc.claimer.measured("claim", 2000, time.perf_counter() - SLOW_STATEMENT - 0.5)
    (record,) = caplog.records
    assert record.getMessage().startswith("slow claim: 1.5s for 2000 rows")
    assert recorded == [("delete", 1000), ("claim", 2000)]
