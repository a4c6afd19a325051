"""The firer with the claim that deletes (CHRONOS_FIRER_CLAIM=delete), on the in-memory twin and a Kafka double:
each claim's rows held in a transaction of their own until every one is settled, then committed (or rolled
back); at most MAX_HELD_BATCHES batches in flight; a transaction the server ended publishes nothing twice
over its firer's head; recurring schedules keep the stamp."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import KafkaError

from chronos import codec
from chronos.adapters.memory import MemoryStore, MemoryTakes
from chronos.domain import cron
from chronos.domain.model import Row
from chronos.errors import ClaimContended, StoreUnavailable
from chronos.roles.firer.claiming import MAX_HELD_BATCHES
from kafka_double import FakePublisher
from test_roles_firer import TIMEOUT, Firer, wait_for
from test_roles_firer import cycle as firer_cycle

DELETE = {"CHRONOS_FIRER_CLAIM": "delete"}


def cycle(f: Firer) -> None:
    """One claim, its publishes and their reports, and the settling of what they say."""
    firer_cycle(f, settle_ahead_s=1.0)


def test_a_claim_holds_its_rows_until_every_one_is_acknowledged_then_commits():
    f = Firer(**DELETE)
    f.add("a", "b")
    f.proc.claimer.claim(time.time())
    assert f.state() == {"a": "held", "b": "held"}
    assert all(r.readied_us is None for r in f.db.rows.values())  # not stamped: held by the transaction
    assert MemoryStore(f.db, node_id=uuid.uuid4()).claim(10, 0) == []  # no other claim takes them
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.publisher.poll()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())
    assert f.state() == {} and f.proc.batches.in_flight() == 0
    totals = f.proc.shared.totals
    assert (totals.claimed, totals.fired, f.proc.shared.held()) == (2, 2, 0)
    assert [p.value for p in f.publisher.produced] == [b"a", b"b"]


def test_a_batch_ends_only_once_its_last_row_is_settled():
    f = Firer(**DELETE)
    f.add("now")
    f.add("soon", due_in=0.2)  # within the lookahead: published at its deadline
    f.proc.claimer.claim(time.time())
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.publisher.poll()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())
    assert f.state() == {"now": "held", "soon": "held"}  # acknowledged, not committed: the batch is not over
    assert f.proc.shared.totals.fired == 0
    wait_for(lambda: time.time() >= f.db.rows["soon"].deadline_us / 1e6, "the second row's deadline")
    f.proc.sender.publish_due()
    f.publisher.poll()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())
    assert f.state() == {} and f.proc.shared.totals.fired == 2


def test_a_batch_commits_its_fired_and_dead_rows_and_puts_back_those_to_retry_or_hand_back():
    def refuse(topic, value):
        if topic != "chronos.output":   # the dead-letter topic takes what it is sent
            return None
        return {b"retry": KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), b"huge": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE),
                b"back": KafkaError(KafkaError._MSG_TIMED_OUT)}.get(value)
    f = Firer(FakePublisher(refuse), **DELETE)
    f.add("fired", "retry", "huge", "back")
    before = {m: (f.db.rows[m].seq, f.db.rows[m].deadline_us) for m in ("back", "retry")}
    cycle(f)
    assert f.proc.batches.in_flight() == 0
    assert set(f.state()) == {"retry", "back"} and set(f.state().values()) == {"waiting"}
    back, retry = f.db.rows["back"], f.db.rows["retry"]
    assert (back.seq, back.deadline_us, back.attempts) == (*before["back"], 0)   # handed back as it was
    assert (retry.seq, retry.attempts, retry.original_deadline_us) == (before["retry"][0], 1, before["retry"][1])
    assert retry.deadline_us > time.time() * 1e6 and retry.last_error.startswith("UNKNOWN_TOPIC_OR_PART")
    assert [p.message.message_id for p in f.db.parked] == []   # the dead letter was acknowledged
    totals = f.proc.shared.totals
    assert (totals.fired, totals.dead, totals.retried, totals.released) == (1, 1, 1, 1)


def test_a_batch_none_of_whose_rows_went_anywhere_is_rolled_back():
    f = Firer(FakePublisher(lambda topic, value: KafkaError(KafkaError._MSG_TIMED_OUT)), **DELETE)
    f.add("a", "b")
    ctids = {m: f.db.rows[m].ctid for m in ("a", "b")}
    cycle(f)
    assert f.state() == {"a": "waiting", "b": "waiting"}
    assert {m: f.db.rows[m].ctid for m in ("a", "b")} == ctids  # rolled back: the very rows, untouched
    assert f.proc.shared.totals.released == 2 and f.proc.batches.in_flight() == 0


def test_a_dead_letter_the_dead_letter_topic_refuses_for_good_is_parked_in_the_batch():
    f = Firer(FakePublisher(lambda topic, value: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if value == b"huge"
                            else None), **DELETE)
    f.add("huge", "fine")
    cycle(f)
    assert f.state() == {} and [p.message.message_id for p in f.db.parked] == ["huge"]
    assert (f.proc.shared.totals.parked, f.proc.shared.totals.fired) == (1, 1)


def test_a_batch_whose_transaction_the_server_ended_is_counted_and_its_rows_fire_again(caplog):
    """PostgreSQL ended the transaction (the firer held it past the hold time): its rows are back, and those
    already published will be published again by whoever takes them next."""
    f = Firer(**DELETE)
    f.add("a")
    f.proc.claimer.claim(time.time())
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.publisher.poll()
    f.proc.sender.hand_over()
    [batch] = f.proc.batches.open.values()
    assert isinstance(batch.session, MemoryTakes)
    batch.session.end()
    assert f.state() == {"a": "waiting"}
    caplog.set_level("WARNING", logger="chronos.firer")
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())
    assert f.state() == {"a": "waiting"} and f.proc.batches.in_flight() == 0
    totals = f.proc.shared.totals
    assert (totals.fired, totals.vanished) == (0, 1)
    assert "could not be committed" in caplog.text
    f.proc.claimer.claim(time.time())   # the session is free again, and takes the row anew
    assert f.state() == {"a": "held"}


def test_no_more_batches_are_held_than_sessions_and_claiming_resumes_when_one_ends():
    f = Firer(CHRONOS_BATCH_SIZE="1", **DELETE)
    f.add(*(f"m{i:02}" for i in range(MAX_HELD_BATCHES + 2)))
    claimer = f.proc.claimer
    for _ in range(MAX_HELD_BATCHES + 1):
        claimer.claim(time.time())
    assert f.proc.batches.in_flight() == MAX_HELD_BATCHES == len(f.proc.batches.all)
    assert list(f.state().values()).count("held") == MAX_HELD_BATCHES
    now = time.time()
    claimer.claim(now)
    assert claimer.next_claim == now + 0.005 and f.proc.shared.reserved == 0  # waits for a session
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.publisher.poll()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())
    assert f.proc.batches.in_flight() == 0 and len(f.proc.batches.idle) == MAX_HELD_BATCHES
    claimer.claim(time.time())
    assert list(f.state().values()).count("held") == 1


def test_rows_held_longer_than_three_quarters_of_the_hold_time_are_given_back_unpublished():
    f = Firer(CHRONOS_HOLD_TIME_MS="4000", **DELETE)
    f.add("old")
    f.proc.claimer.claim(time.time())
    sent, rows = f.proc.sender.inbox.get_nowait()
    f.proc.sender.inbox.put((sent - 3.1, rows))  # its claim sent 3.1 s ago (a firer stopped meanwhile)
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time())
    assert f.publisher.produced == [] and f.state() == {"old": "waiting"}
    assert f.proc.shared.totals.expired == 1 and f.proc.batches.in_flight() == 0


def test_shutdown_commits_what_was_acknowledged_and_gives_back_what_was_not_published():
    f = Firer(CHRONOS_LOOKAHEAD_MS="60000", CHRONOS_HOLD_TIME_MS="130000", **DELETE)
    f.add("now")
    f.add("in-30s", due_in=30.0)  # taken in the same batch, published only at its deadline
    thread = threading.Thread(target=f.proc.run)
    thread.start()
    try:
        wait_for(lambda: f.publisher.produced, "the due row to be published")
        assert f.state() == {"now": "held", "in-30s": "held"}
    finally:
        f.life.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert f.state() == {"in-30s": "waiting"} and f.db.rows["in-30s"].held_by is None
    totals = f.proc.shared.totals
    assert (totals.claimed, totals.fired, totals.released) == (2, 1, 1)
    assert f.proc.batches.all == []  # every session closed


def test_recurring_schedules_keep_the_stamp_and_are_settled_by_statements():
    f = Firer(**DELETE)
    first = datetime.now(timezone.utc) - timedelta(seconds=1)
    MemoryStore(f.db).apply([Row("every-minute", cron.to_us(first), None, b"k", b"tick", codec.encode_headers([]),
                                 cron="* * * * *")], [], [])
    cycle(f)
    occurrences = [p for p in f.publisher.produced if p.value == b"tick"]
    assert len(occurrences) == 1 and f.proc.batches.in_flight() == 0
    assert set(f.state()) == {"every-minute"} and f.proc.shared.totals.fired == 1


def test_fire_rate_limits_hold_with_the_claim_that_deletes():
    f = Firer(CHRONOS_FIRE_RATE_LIMITS="chronos.output=5", **DELETE)
    f.add(*(f"m{i:02}" for i in range(20)))
    for _ in range(3):
        cycle(f)
    assert len(f.publisher.produced) == 5  # one bucketful: the rate's first second
    assert f.proc.shared.totals.fired == 5 and len(f.state()) == 15
    assert f.db.buckets["chronos.output"].tokens < 1


def test_a_contended_claim_gives_its_room_and_session_back_and_claims_again():
    f = Firer(**DELETE)
    f.add("a")

    class Contended(MemoryTakes):
        def claim_share(self, *args, **kwargs):
            raise ClaimContended("a row picked was locked by another transaction")

        def claim_whole(self, *args, **kwargs):
            raise ClaimContended("a row picked was locked by another transaction")
    f.proc.batches.make = lambda: Contended(f.db, node_id=f.node)
    now = time.time()
    f.proc.claimer.claim(now)
    assert f.proc.claimer.next_claim == now + 0.005
    assert (f.proc.shared.reserved, f.proc.shared.held(), f.proc.batches.in_flight()) == (0, 0, 0)
    assert len(f.proc.batches.idle) == 1 and f.state() == {"a": "waiting"}


def test_a_stamping_firer_and_a_deleting_one_never_take_the_same_row():
    """Beside each other on one store (a rollout): each leaves alone what the other holds, whichever way."""
    deleting = Firer(CHRONOS_BATCH_SIZE="3", **DELETE)
    stamping = Firer(CHRONOS_BATCH_SIZE="3", CHRONOS_FIRER_CLAIM="stamp")
    stamping.proc.claimer.store = MemoryStore(deleting.db, node_id=stamping.node)
    deleting.add(*(f"m{i:02}" for i in range(10)))
    MemoryStore(deleting.db).apply([Row(f"k{i}", int((time.time() - 1) * 1e6) + i, None, b"k", b"v", b"", "K")
                                    for i in range(3)], [], [])
    for _ in range(10):
        deleting.proc.claimer.claim(time.time())
        stamping.proc.claimer.claim(time.time())
    held = {r.id for r in deleting.db.rows.values() if r.held_by is not None}
    stamped = {r.id for r in deleting.db.rows.values() if r.readied_us is not None}
    assert held and stamped and not held & stamped
    assert held | stamped >= set(deleting.db.rows) - {"k1", "k2"}
    for later in ({"k1", "k2"} & (held | stamped)):   # a key's later row only with its first, by the same firer
        assert "k0" in (held if later in held else stamped)


def test_a_claim_that_finds_postgresql_gone_closes_the_free_sessions_so_the_next_claims_connect_anew():
    """After a failover every free session's connection is most likely broken: one claim failing on each in turn
    would add a backoff each."""
    f = Firer(CHRONOS_BATCH_SIZE="1", **DELETE)
    f.add("a", "b")
    batches = f.proc.batches
    for _ in range(2):
        f.proc.claimer.claim(time.time())   # two sessions made, each holding a batch
    for batch in list(batches.open.values()):
        batch.session.give_back()
        batches.ended(batch)
    closed: list = []
    for session in batches.idle:
        session.close = lambda session=session: closed.append(session)

    def unavailable(*args, **kwargs):
        raise StoreUnavailable("server closed the connection unexpectedly")
    failing = batches.idle[-1]   # the next claim's
    failing.claim_share = failing.claim_whole = unavailable
    with pytest.raises(StoreUnavailable):
        f.proc.claimer.claim(time.time())
    assert sorted(map(id, closed)) == sorted(map(id, batches.all)) and f.proc.shared.reserved == 0
    assert sorted(map(id, batches.idle)) == sorted(map(id, batches.all))   # free still: each reconnects when used
