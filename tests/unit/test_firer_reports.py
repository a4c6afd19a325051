"""The firer's delivery reports taken in batches: in the order they came, and counted as the
per-message path counted them (the lateness histogram, the array literals of the settling)."""

from __future__ import annotations

import uuid

from prometheus_client.exposition import generate_latest

from chronos.adapters.postgres.arrays import text_array
from chronos.telemetry.metrics import LATENESS_BUCKETS, FirerTelemetry
from kafka_double import FakePublisher, FakePublishers, settings
from test_producer_watch import FENCED, run_once
from test_roles_firer import Firer


def test_reports_of_one_poll_are_taken_in_the_order_they_came():
    """An acknowledgement after a producer fault clears it (as it did when each report was taken in
    its callback): taking the run of acknowledgements first would replace a producer that works."""
    def fenced_once(topic, value):
        return FENCED if value == b"b" else None
    publishers = FakePublishers(lambda n: FakePublisher(fenced_once))
    f = Firer(producers=publishers)
    f.add("a", due_in=-3.0)
    f.add("b", due_in=-2.0)
    f.add("c", due_in=-1.0)
    run_once(f)
    assert [p.value for p in publishers.made[0].produced] == [b"a", b"b", b"c"]
    assert len(publishers.made) == 1 and f.proc.slot.watch.wanted is None  # acknowledged after the fault
    assert f.state() == {"b": "waiting"} and f.db.rows["b"].attempts == 0  # handed back uncounted
    assert f.proc.shared.in_flight == 0 and not f.proc.shared.sent_at and not f.proc.sender.reports


def test_a_failure_after_the_last_acknowledgement_still_asks_for_a_new_producer():
    publishers = FakePublishers(lambda n: FakePublisher((lambda t, v: FENCED if v == b"b" else None) if n == 0
                                                        else None))
    f = Firer(producers=publishers)
    f.add("a", due_in=-2.0)
    f.add("b", due_in=-1.0)
    run_once(f)
    assert len(publishers.made) == 2 and f.proc.slot.watch.replacements["fault"] == 1


def test_the_publish_latency_is_averaged_over_each_acknowledgement():
    f = Firer()
    f.add("a", "b", "c")
    f.proc.claimer.claim(0)
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.publisher.poll()
    sent = f.proc.sender.reports[0][1]
    f.proc.sender.take_reports()
    now = f.proc.slot.watch.since  # the acknowledgements' time
    expected = 0.0
    for _ in range(3):
        expected += 0.05 * (now - sent - expected)
    assert f.proc.sender.timing.latency == expected and f.proc.shared.in_flight == 0


def histogram(t: FirerTelemetry) -> list[str]:
    return [line for line in generate_latest(t.registry).decode().splitlines()
            if line.startswith("chronos_fire_lateness_seconds")]


def test_lateness_observed_together_is_the_histogram_of_each_observed_alone():
    values = [-1.0, -0.05, -0.0499, 0.0, 0.003, 0.005, 0.0051, 0.2, 0.2, 59.0, 61.0, 1e9]
    assert set(LATENESS_BUCKETS) & set(values)  # bounds themselves fall in their own bucket
    node = uuid.uuid4()
    alone, together = FirerTelemetry(node, settings()), FirerTelemetry(node, settings())
    for v in values:
        alone.lateness.observe(v)
    together.fired(values)
    together.fired([])
    assert histogram(together) == histogram(alone)


def test_an_array_literal_escapes_only_when_a_value_needs_it():
    assert text_array([]) == "{}"
    assert text_array(["(0,1)", "order-7", "é"]) == '{"(0,1)","order-7","é"}'
    assert text_array(iter(['a"b', "c\\d", "e"])) == '{"a\\"b","c\\\\d","e"}'
