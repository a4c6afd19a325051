"""Producer faults against message faults: a producer the broker refuses (fenced, forgotten) or that
falls silent is replaced and its messages handed back uncounted; only a failure about the message or
its topic counts against the message. The watch's rules with explicit time, the slot that replaces a
producer, then the firer's and the consumer's loops on Kafka doubles."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka import KafkaError

from chronos.adapters.kafka.clients import OutageLog
from chronos.domain.delivery import (PERMANENT_FAILURE, PRODUCER_FAILURE, REFUSED, UNANSWERED_FAILURE,
                                     UNCLEAR_FAILURE, classify)
from chronos.runtime.producer import ProducerSlot, ProducerWatch
from chronos.adapters.memory import MemoryDatabase, MemoryStore
from chronos.telemetry.metrics import ConsumerTelemetry
from chronos.roles.consumer import ConsumerProcess, sort_batch
from chronos.runtime.process import Lifecycle
from kafka_double import FakeMessage, FakePublisher, FakePublishers, settings
from test_roles_consumer import FakeConsumer, hdrs
from test_roles_firer import Firer

FENCED = KafkaError(KafkaError.PRODUCER_FENCED, "There is a newer producer with the same transactionalId")


@pytest.mark.parametrize("code", [KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                                  KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                  KafkaError._FENCED, KafkaError.CLUSTER_AUTHORIZATION_FAILED])
def test_errors_about_the_producer_s_identity_or_state_are_the_producer_s(code):
    assert classify(KafkaError(code)) == PRODUCER_FAILURE


def test_an_error_chronos_does_not_know_is_unclear():
    assert classify(KafkaError(KafkaError.UNKNOWN, "unknown broker error")) == UNCLEAR_FAILURE


# -- the watch, with explicit time ----------------------------------------------------------------

def test_a_producer_fault_asks_for_a_replacement_at_once_then_no_sooner_than_a_growing_gap():
    watch = ProducerWatch("test", stall_s=10.0, now=0.0)
    assert watch.failed(FENCED, "out", 1.0) == PRODUCER_FAILURE
    assert watch.due(1.0) == "PRODUCER_FENCED: There is a newer producer with the same transactionalId"
    watch.replaced(watch.due(1.0), 1.0)
    assert watch.due(1.0) is None
    watch.failed(FENCED, "out", 1.1)
    assert watch.due(1.2) is None and watch.due(1.5) is not None  # 0.5 s after the first replacement
    watch.replaced("again", 1.5)
    watch.failed(FENCED, "out", 1.6)
    assert watch.due(2.2) is None and watch.due(2.5) is not None  # then 1 s
    assert watch.replacements == {"fault": 2, "stall": 0}
    watch.acked(3.0)  # the episode ends: the next fault is answered at once again
    watch.failed(FENCED, "out", 3.1)
    assert watch.due(3.1) is not None


def test_a_refusal_of_one_topic_counts_but_refusals_of_several_topics_and_no_acknowledgement_do_not():
    watch = ProducerWatch("test", stall_s=10.0, now=0.0)
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert watch.failed(denied, "a", 1.0) == REFUSED
    assert watch.failed(denied, "a", 1.1) == REFUSED
    assert watch.failed(denied, "b", 1.2) == PRODUCER_FAILURE  # every topic at once
    assert watch.due(1.2) is not None
    watch.acked(2.0)
    assert watch.failed(denied, "b", 2.1) == REFUSED  # one topic again, after the producer worked


def test_an_unclear_error_counts_only_while_the_producer_was_acknowledged_lately():
    watch = ProducerWatch("test", stall_s=10.0, now=0.0)
    unknown = KafkaError(KafkaError.UNKNOWN)
    watch.acked(5.0)
    assert watch.failed(unknown, "a", 6.0) == REFUSED
    assert watch.failed(unknown, "a", 15.1) == PRODUCER_FAILURE  # nothing acknowledged for the stall time


def test_outages_and_permanent_refusals_keep_their_meaning():
    watch = ProducerWatch("test", stall_s=10.0, now=0.0)
    assert watch.failed(KafkaError(KafkaError._MSG_TIMED_OUT), "a", 1.0) == UNANSWERED_FAILURE
    assert watch.failed(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "b", 1.0) == PERMANENT_FAILURE
    assert watch.due(1.0) is None


def test_publishing_stalls_after_the_stall_time_of_work_without_acknowledgement_and_recovers(caplog):
    watch = ProducerWatch("the test", stall_s=10.0, now=0.0)
    watch.working(False, 100.0)
    assert watch.stalled_for(200.0) == 0.0  # idle is not stalled, however long
    watch.working(True, 200.0)               # work starts: the clock starts
    assert watch.stalled_for(209.0) == 0.0 and watch.due(209.0) is None
    assert watch.stalled_for(211.0) == pytest.approx(11.0)
    with caplog.at_level(logging.WARNING, logger="chronos.kafka"):
        why = watch.due(211.0)
        assert why == "nothing acknowledged for 11.0s"
        watch.replaced(why, 211.0)
        assert watch.due(215.0) is None  # the new producer gets a full window
        watch.replaced("nothing acknowledged for 21.0s", 221.0)
        watch.acked(222.0)
    assert watch.stalled_for(222.0) == 0.0
    assert watch.replacements == {"fault": 0, "stall": 2}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["publishing stalled for the test: nothing acknowledged for 11.0s while messages wait; "
                      "replacing the Kafka producer (logged once until publishing works again)"]
    assert "publishing works again for the test after 22.0s" in caplog.text


# -- the slot both roles replace their producer in --------------------------------------------------

class Owing(FakePublisher):
    """A producer whose purged publishes report one per `flush`: it owes reports after its replacement."""

    def __init__(self, owed: int):
        super().__init__()
        self.owed = owed

    def flush(self, timeout: float = -1) -> int:
        self.owed = max(0, self.owed - 1)
        return self.owed


def test_a_replaced_producer_is_served_until_it_owes_no_report():
    made: list[FakePublisher] = [Owing(owed=4), FakePublisher()]
    slot = ProducerSlot(lambda: (made.pop(0), OutageLog("test")), ProducerWatch("test", stall_s=10.0, now=0.0))
    old = slot.producer
    slot.look_after(0.5)
    assert slot.producer is old and slot.generation == 0  # nothing wrong: kept
    slot.watch.failed(FENCED, "out", 1.0)
    slot.look_after(1.0)  # replaced: the purge's flush and the serving after it took two reports of four
    assert slot.producer is not old and slot.generation == 1 and slot.retired == [old]
    slot.look_after(1.1)
    assert slot.retired == [old]
    slot.look_after(1.2)
    assert slot.retired == [] and slot.watch.replacements == {"fault": 1, "stall": 0}


# -- the firer ------------------------------------------------------------------------------------

def fenced_then_fine(n: int) -> FakePublisher:
    """The first producer is fenced on every topic; the ones after it are taken."""
    return FakePublisher((lambda topic, value: FENCED) if n == 0 else None)


def run_once(f: Firer) -> None:
    """One pass of the firer: claim, publish, serve reports, look after the producer, settle."""
    f.proc.claimer.claim(time.time())
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.proc.sender.send_dead()
    f.proc.slot.producer.poll(0)
    f.proc.sender.look_after_producer()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())


def test_a_fenced_firer_producer_is_replaced_and_its_rows_handed_back_uncounted_then_fired():
    publishers = FakePublishers(fenced_then_fine)
    f = Firer(producers=publishers, CHRONOS_ALLOWED_TOPICS=".*")
    f.add("a", "b")
    f.add("c", topic="other")
    run_once(f)
    assert len(publishers.made) == 2  # replaced at once
    assert f.state() == {"a": "waiting", "b": "waiting", "c": "waiting"}
    assert all(row.attempts == 0 for row in f.db.rows.values())  # nothing counted against them
    f.proc.shared.claims_resume_at = 0.0
    run_once(f)
    assert f.state() == {}
    assert sorted(p.value for p in publishers.made[1].produced) == [b"a", b"b", b"c"]
    assert all(p.topic != f.settings.dlq_topic for m in publishers.made for p in m.produced)
    assert f.proc.slot.watch.replacements == {"fault": 1, "stall": 0}


def test_rows_are_not_claimed_again_at_once_after_a_producer_fault():
    f = Firer(producers=FakePublishers(fenced_then_fine))
    f.add("a")
    run_once(f)
    assert f.state() == {"a": "waiting"}
    f.proc.claimer.claim(time.time())
    assert f.state() == {"a": "waiting"}  # the claim waits for the new producer


def test_a_producer_fault_never_dead_letters_however_long_it_lasts():
    publishers = FakePublishers(lambda n: FakePublisher(lambda topic, value: FENCED))  # every producer fenced
    f = Firer(producers=publishers, CHRONOS_MAX_PUBLISH_ATTEMPTS="2")
    f.add("a")
    for _ in range(6):
        f.proc.shared.claims_resume_at = 0.0
        f.proc.slot.watch.next_replacement = 0.0
        run_once(f)
    assert f.state() == {"a": "waiting"} and f.db.rows["a"].attempts == 0
    assert all(p.topic != f.settings.dlq_topic for m in publishers.made for p in m.produced)
    assert len(publishers.made) == 7


def test_a_silent_firer_producer_is_replaced_after_the_stall_time_and_health_fails_meanwhile():
    def silent_then_fine(n: int) -> FakePublisher:
        publisher = FakePublisher()
        publisher.answering = n > 0
        return publisher
    publishers = FakePublishers(silent_then_fine)
    f = Firer(producers=publishers, CHRONOS_PUBLISH_STALL_MS="200")
    f.add("a")
    run_once(f)
    assert f.state() == {"a": "held"} and f.proc.shared.in_flight == 1
    assert f.proc.metrics.health_report()[0]
    time.sleep(0.25)  # the stall time passing is what is tested
    ok, report = f.proc.metrics.health_report()
    assert not ok and "publishing" in report["reason"] and "nothing acknowledged" in report["reason"]
    f.proc.sender.look_after_producer()  # replaced: the silent one's publish is purged and its row handed back
    assert len(publishers.made) == 2 and f.proc.shared.in_flight == 0
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())
    assert f.state() == {"a": "waiting"} and f.db.rows["a"].attempts == 0
    run_once(f)
    assert f.state() == {} and f.proc.metrics.health_report()[0]
    assert f.proc.slot.watch.replacements == {"fault": 0, "stall": 1}


def test_a_refused_topic_still_counts_attempts_and_dead_letters_while_others_are_acknowledged():
    f = Firer(FakePublisher(lambda topic, value: KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
                            if topic == "denied" else None), CHRONOS_ALLOWED_TOPICS=".*",
              CHRONOS_MAX_PUBLISH_ATTEMPTS="1")
    f.add("ok")
    f.add("x", topic="denied")
    run_once(f)
    run_once(f)
    assert f.state() == {}
    assert [p.topic for p in f.publisher.produced].count(f.settings.dlq_topic) == 1
    assert f.proc.slot.watch.replacements == {"fault": 0, "stall": 0}


# -- the consumer ---------------------------------------------------------------------------------

def test_a_fenced_consumer_producer_is_replaced_and_the_late_message_delivered_not_dead_lettered():
    publishers = FakePublishers(fenced_then_fine)
    env = settings()
    db = MemoryDatabase()
    inputs: list[FakeConsumer] = []

    def consumers(on_commit):
        inputs.append(FakeConsumer(on_commit))
        return inputs[-1], OutageLog("test consumer")
    proc = ConsumerProcess(env, Lifecycle(), store=MemoryStore(db), producers=publishers, consumers=consumers,
                           telemetry=ConsumerTelemetry(uuid.uuid4(), env), watchers=lambda: inputs[-1])
    late = FakeMessage(hdrs("late", int(time.time() * 1000) - 1000))
    batch = sort_batch([late], time.time_ns() // 1000, proc.rules)
    assert proc.writer.write([late], batch)
    assert len(publishers.made) == 2
    assert [p.topic for p in publishers.made[1].produced] == [env.output_topic]
    assert proc.stats["dead"] == 0 and proc.stats["late"] == 1
    assert proc.slot.watch.replacements == {"fault": 1, "stall": 0}

