"""The firer's three threads on the in-memory store and a Kafka double: claim pacing, back-pressure,
the cap on held rows, settling, and the hand-back at shutdown."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timezone

from typing import Callable

import pytest
from confluent_kafka import KafkaError

from chronos import codec
from chronos.adapters.kafka.clients import OutageLog
from chronos.adapters.memory import MemoryDatabase, MemoryStore, MemoryTakes
from chronos.domain.model import Claimed, Mark, Row
from chronos.telemetry.metrics import FirerTelemetry
from chronos.roles.firer import FirerProcess
from chronos.roles.firer.claimer import SEQ_READ_EVERY, WINDOW_CLAIM_EVERY
from chronos.roles.firer.claiming import FULL_CLAIM_EVERY, MAX_HELD_BATCHES, RECENT_WINDOW_MS
from chronos.roles.firer.decisions import TICK
from chronos.roles.firer.handoff import Outcomes, Stop
from chronos.roles.firer.sender import IDLE_WAIT
from chronos.roles.firer.store_thread import SLOW_STATEMENT
from chronos.runtime.process import Lifecycle
from kafka_double import FakePublisher, settings

TIMEOUT = 10.0


class Firer:
    """A firer on an in-memory database, with its parts at hand. One claimer unless CHRONOS_FIRER_CLAIMERS
    says otherwise: the tests that drive `proc.claimer` directly mean it to claim every due row (the
    claimers' division is tested in test_firer_claimers.py), full claims too, as a firer whose claims stamp
    runs them, unless `sweep`: then each claimer's sweeper runs them (test_firer_sweeper.py)."""

    def __init__(self, publisher: FakePublisher | None = None, store_class: type[MemoryStore] = MemoryStore,
                 producers: Callable[[], tuple[FakePublisher, OutageLog]] | None = None, sweep: bool = False,
                 **env: str):
        self.store_class = store_class
        self.db = MemoryDatabase()
        self.node = uuid.uuid4()
        self.publisher = publisher or FakePublisher()
        self.settings = settings(**{"CHRONOS_FIRER_CLAIMERS": "1", **env})
        self.life = Lifecycle()
        self.proc = FirerProcess(self.settings, self.life, stores=self.store,
                                 producers=producers or self.publisher.factory(),
                                 telemetry=FirerTelemetry(self.node, self.settings), takes=self.takes)
        if not sweep:
            for sweeper in self.proc.sweepers:
                sweeper.claimer.swept = False
            self.proc.sweepers = []

    def store(self) -> MemoryStore:
        return self.store_class(self.db, node_id=self.node)

    def takes(self) -> MemoryTakes:
        """A session of the claim that deletes (CHRONOS_FIRER_CLAIM=delete)."""
        return MemoryTakes(self.db, node_id=self.node)

    def add(self, *ids: str, due_in: float = -1.0, topic: str | None = None) -> None:
        """Waiting rows, due `due_in` seconds from now (already due by default)."""
        deadline = int((time.time() + due_in) * 1e6)
        MemoryStore(self.db).apply([Row(i, deadline, topic, b"k", i.encode(), codec.encode_headers([]))
                                    for i in ids], [], [])

    def state(self) -> dict[str, str]:
        """id -> waiting or held (stamped as claimed, or held by a claim that deletes), of the rows in the database."""
        return {r.id: "held" if r.in_flight else "waiting" for r in self.db.rows.values()}


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def cycle(f: Firer, settle_ahead_s: float = 0.0) -> None:
    """One claim, its publishes and their reports, and the settling of what they say (`settle_ahead_s`
    past now, so that a settle due within that time is made)."""
    f.proc.claimer.claim(time.time())
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.publisher.poll()
    f.proc.sender.send_dead()
    f.publisher.poll()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time() + settle_ahead_s)


def claimed(mid: str, deadline_s: float) -> Claimed:
    return Claimed(mid, int(deadline_s * 1e6), None, b"k", mid.encode(), None, datetime.now(timezone.utc))


def test_a_full_claim_claims_again_at_once_and_a_partial_one_after_the_poll_interval():
    f = Firer(CHRONOS_BATCH_SIZE="2", CHRONOS_POLL_INTERVAL_MS="200")
    f.add("a", "b", "c")
    claimer, now = f.proc.claimer, time.time()
    claimer.claim(now)
    assert f.proc.shared.held() == 2 and claimer.next_claim == now  # a backlog: drain it without sleeping
    claimer.claim(now)
    assert f.state() == {"a": "held", "b": "held", "c": "held"}
    assert now + 0.18 <= claimer.next_claim <= now + 0.22  # the poll interval, jittered by 10%
    assert [len(rows) for _, rows in (f.proc.sender.inbox.get_nowait(), f.proc.sender.inbox.get_nowait())] == [2, 1]


class WindowsSeen(MemoryStore):
    """The in-memory store, keeping the window of every claim (None: a full claim) and where it started."""

    windows: list[int | None] = []
    afters: list[Mark | None] = []

    def claim_whole(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        self.windows.append(window_ms)
        self.afters.append(after)
        return super().claim_whole(limit, lookahead_ms, window_ms, after)


class TakesSeen(MemoryTakes):
    """A session of the claim that deletes, keeping (window, after) of every claim, as WindowsSeen."""

    claims: list[tuple[int | None, Mark | None]] = []
    seq_reads = 0

    def last_seq(self) -> int | None:
        TakesSeen.seq_reads += 1
        return super().last_seq()

    def claim_whole(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        self.claims.append((window_ms, after))
        return super().claim_whole(limit, lookahead_ms, window_ms, after)

    def claim_share(self, slices: tuple[int, ...], limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        if lookahead_ms >= 0:  # not a take of the others' overdue rows
            self.claims.append((window_ms, after))
        return super().claim_share(slices, limit, lookahead_ms, window_ms, after)


class TakingFirer(Firer):
    def takes(self) -> MemoryTakes:
        return TakesSeen(self.db, node_id=self.node)


def test_a_claim_after_one_that_came_back_full_starts_where_it_ended_and_a_row_below_waits_for_the_window():
    """A firer alone's claim walks its own rows in flight (deleted by transactions still open) unless it starts
    past the last row it took. A row written below that mark meanwhile is taken by the next claim of the window:
    once the claims no longer come back full, or WINDOW_CLAIM_EVERY after the last one."""
    TakesSeen.claims = []
    f = TakingFirer(CHRONOS_BATCH_SIZE="2")  # the claim that deletes, the default
    f.add("a", "b", "c", "d", "e", due_in=-0.2)
    claimer = f.proc.claimer
    claimer.claim(time.time())  # the first claim is a full one, and comes back full
    b = f.db.rows["b"]
    f.add("late", due_in=-0.5)  # below the mark: due before b
    claimer.claim(time.time())
    assert TakesSeen.claims == [(None, None), (RECENT_WINDOW_MS, Mark(b.deadline_us, b.seq))]
    assert f.state() == {"a": "held", "b": "held", "c": "held", "d": "held", "e": "waiting", "late": "waiting"}
    claimer.cursor.window_at = time.monotonic()  # WINDOW_CLAIM_EVERY went by
    claimer.claim(time.time())
    assert TakesSeen.claims[-1] == (RECENT_WINDOW_MS, None) and f.state()["late"] == "held"
    assert WINDOW_CLAIM_EVERY == 0.2


def test_with_the_last_seq_known_every_claim_starts_past_the_last_row_and_below_it_finds_only_rows_written_since():
    """Every SEQ_READ_EVERY the claimer reads the last seq again, with no claim of its own; past three reads the
    firer knows an older seq than any row written since: a claim that came back short moves the mark too, and
    below it the next claim finds a row written late, but not a row of an older seq (one put back, or replaced
    with a deadline that close), which waits for the full claim, every FULL_CLAIM_EVERY: only a full claim walks
    the due index from its head, past the entries of every row taken since its last vacuum."""
    TakesSeen.claims, TakesSeen.seq_reads = [], 0
    f = TakingFirer()
    claimer = f.proc.claimer
    f.add("old", due_in=60)
    claimer.claim(time.time())  # the first claim is a full one, the last seq read before it
    for _ in range(2):  # two more reads between full claims, each with a claim of recent rows
        claimer.next_seq_read = time.monotonic()
        claimer.claim(time.time())
    assert TakesSeen.seq_reads == 3 and [w for w, _ in TakesSeen.claims] == [None, RECENT_WINDOW_MS, RECENT_WINDOW_MS]
    assert claimer.next_full_claim - time.monotonic() > SEQ_READ_EVERY
    f.add("a", due_in=-0.1)
    claimer.claim(time.time())  # of the window, short
    a = f.db.rows["a"]
    f.add("late", due_in=-0.3)
    f.db.rows["old"].deadline_us = a.deadline_us - 1000  # below the mark, with an older seq
    claimer.claim(time.time())
    assert TakesSeen.claims[-1] == (RECENT_WINDOW_MS, Mark(a.deadline_us, a.seq, f.db.rows["old"].seq))
    assert f.state() == {"old": "waiting", "a": "held", "late": "held"}
    claimer.next_full_claim = time.monotonic()  # FULL_CLAIM_EVERY went by
    claimer.claim(time.time())
    assert TakesSeen.claims[-1] == (None, None) and f.state()["old"] == "held"
    assert SEQ_READ_EVERY == 0.5 and FULL_CLAIM_EVERY == 2.0


def test_a_claim_that_held_a_row_back_by_its_ordering_key_is_followed_by_one_of_the_window():
    TakesSeen.claims = []
    f = TakingFirer(CHRONOS_BATCH_SIZE="2")
    deadline = int((time.time() - 0.2) * 1e6)
    MemoryStore(f.db).apply([Row("k1", deadline, None, b"k", b"1", b"", ordering_key="key"),
                             Row("k2", deadline + 1, None, b"k", b"2", b"", ordering_key="key")], [], [])
    first = f.takes()
    assert [r.id for r in first.claim(1, 300)] == ["k1"]  # another session holds k1: k2 waits behind it
    f.add("x", "y", due_in=-0.1)
    claimer = f.proc.claimer
    claimer.claim(time.time())  # k2 held back, x taken
    assert f.state()["k2"] == "waiting" and not claimer.cursor.after
    claimer.claim(time.time())
    assert TakesSeen.claims[-1][1] is None


def test_claims_between_full_ones_take_only_recent_deadlines_and_a_late_row_waits_for_the_next_full_one():
    WindowsSeen.windows = []
    f = Firer(store_class=WindowsSeen, CHRONOS_FIRER_CLAIM="stamp")  # the windows of the stamp's claims
    claimer = f.proc.claimer
    f.add("first", due_in=-0.5)
    claimer.claim(time.time())  # the first claim is a full one: it found nothing late
    full_at = time.monotonic()
    assert full_at + 0.4 <= claimer.next_full_claim <= full_at + FULL_CLAIM_EVERY
    f.add("late", due_in=-10.0)  # written 10 s after its deadline (a lagging consumer)
    f.add("recent", due_in=-0.5)
    claimer.claim(time.time())
    assert f.state() == {"first": "held", "late": "waiting", "recent": "held"}
    claimer.next_full_claim = time.monotonic()  # FULL_CLAIM_EVERY went by
    claimer.claim(time.time())
    assert f.state()["late"] == "held"
    # a full claim that found a row older than the window: the next claim is a full one too
    assert claimer.next_full_claim <= time.monotonic()
    claimer.claim(time.time())
    assert WindowsSeen.windows == [None, RECENT_WINDOW_MS, None, None]
    assert claimer.next_full_claim > time.monotonic()  # found nothing late: back to recent claims


def test_a_full_claim_that_comes_back_full_a_second_behind_is_followed_by_a_full_one():
    """A backlog a second or more behind is drained by full claims, not left to one every half second: its
    rest could slip out of the window before the next claim."""
    WindowsSeen.windows = []
    f = Firer(store_class=WindowsSeen, CHRONOS_BATCH_SIZE="2", CHRONOS_FIRER_CLAIM="stamp")
    f.add("a", "b", "c", due_in=-RECENT_WINDOW_MS / 1000 * 0.6)
    claimer = f.proc.claimer
    claimer.claim(time.time())
    claimer.claim(time.time())
    assert WindowsSeen.windows == [None, None] and set(f.state().values()) == {"held"}


def test_a_full_claim_that_comes_back_full_with_recent_rows_only_is_followed_by_a_recent_one():
    """A busy moment is no backlog: the recent claim finds the same rows without walking the due index's head."""
    WindowsSeen.windows = []
    f = Firer(store_class=WindowsSeen, CHRONOS_BATCH_SIZE="2", CHRONOS_FIRER_CLAIM="stamp")
    f.add("a", "b", "c", due_in=-0.2)
    claimer = f.proc.claimer
    claimer.claim(time.time())
    assert claimer.next_claim <= time.time()  # came back full: claim again at once
    claimer.claim(time.time())
    assert WindowsSeen.windows == [None, RECENT_WINDOW_MS] and set(f.state().values()) == {"held"}


def test_no_more_than_sixteen_batches_are_held_and_claiming_resumes_as_rows_are_settled():
    f = Firer(CHRONOS_BATCH_SIZE="2", CHRONOS_FIRER_CLAIM="stamp")
    f.add(*(f"m{i}" for i in range(40)))
    claimer = f.proc.claimer
    for _ in range(MAX_HELD_BATCHES + 2):
        claimer.claim(time.time())
    assert MAX_HELD_BATCHES == 16  # four held claims back at 25,000 msg/s
    assert f.proc.shared.held() == 32 and list(f.state().values()).count("held") == 32
    now = time.time()
    claimer.claim(now)
    assert claimer.next_claim == now + 0.005  # waits for acknowledgements
    f.proc.shared.settled += 1  # one row settled: room for one more, not a whole batch
    claimer.claim(time.time())
    assert f.proc.shared.held() == 32 and list(f.state().values()).count("held") == 33


def test_recurring_schedules_occurrences_are_claimed_within_the_room_left_on_the_cap():
    f = Firer(CHRONOS_BATCH_SIZE="2", CHRONOS_FIRER_CLAIM="stamp")
    f.add(*(f"m{i}" for i in range(2 * MAX_HELD_BATCHES - 1)))
    claimer = f.proc.claimer
    for _ in range(MAX_HELD_BATCHES):
        claimer.claim(time.time())
    assert f.proc.shared.held() == 2 * MAX_HELD_BATCHES - 1  # room for one row more
    first = int((time.time() - 1) * 1e6)
    MemoryStore(f.db).apply([Row(f"every-minute-{i}", first, None, b"k", b"tick", codec.encode_headers([]),
                                 cron="* * * * *") for i in range(2)], [], [])
    claimer.next_schedules = 0.0
    claimer.claim(time.time())
    assert f.proc.shared.held() == 2 * MAX_HELD_BATCHES  # one occurrence of the two due: the cap holds


def test_no_more_is_claimed_while_the_rows_held_come_to_the_byte_cap():
    f = Firer(CHRONOS_BATCH_SIZE="2", CHRONOS_FIRER_MAX_HELD_BYTES="1M")
    big = b"x" * (300 << 10)
    MemoryStore(f.db).apply([Row(f"big{i}", int((time.time() - 1) * 1e6), None, None, big, b"") for i in range(6)],
                            [], [])
    claimer = f.proc.claimer
    for _ in range(4):
        claimer.claim(time.time())
    # two claims of two (1.2 MB held): the cap passed by less than one batch, then nothing more
    assert f.proc.shared.held() == 4 and f.proc.shared.held_bytes() == 4 * len(big)
    _, first = f.proc.sender.inbox.get_nowait()
    f.proc.settler.count_settled(first)  # the first claim's two settled: room again, and the last two claimed
    claimer.claim(time.time())
    assert f.proc.shared.held() == 4 and set(f.state().values()) == {"held"}


def test_nothing_is_claimed_while_the_oldest_publish_waits_too_long_for_kafka(caplog):
    """Acknowledgements still trickle in (an overloaded broker), but the oldest publish has waited
    past half the hold time: claiming more would only have rows handed to a peer and published twice."""
    f = Firer(CHRONOS_HOLD_TIME_MS="5000")
    f.add("a")
    shared, now = f.proc.shared, time.monotonic()
    for sent in (now - 4.0, now - 0.1, now):
        shared.sending(sent)
    shared.ack_progress = now  # an acknowledgement just came back
    caplog.set_level("WARNING", logger="chronos.firer")
    f.proc.claimer.claim(time.time())
    assert f.proc.claimer.claims_paused and f.state() == {"a": "waiting"}
    assert shared.stalled(now) == pytest.approx(4.0)
    shared.delivered()  # acknowledged: the oldest in flight is now 0.1 s old
    assert shared.stalled(now) == pytest.approx(0.1)
    f.proc.claimer.claim(time.time())
    assert f.state() == {"a": "held"}
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "a publish has waited 4.0s for Kafka's acknowledgement", "Kafka acknowledges again"]


def test_claiming_stops_while_kafka_does_not_acknowledge_at_all():
    f = Firer(CHRONOS_HOLD_TIME_MS="1000")
    f.add("a")
    f.proc.shared.sending(time.monotonic() - 0.6)  # unanswered for longer than half the hold time
    f.proc.claimer.claim(time.time())
    assert f.state() == {"a": "waiting"}


def test_rows_are_published_in_deadline_order_and_deleted_once_acknowledged():
    f = Firer()
    f.add("late", due_in=-1.0)
    f.add("later", due_in=-0.5)
    f.add("elsewhere", due_in=-2.0, topic="billing.eu")  # not allowed by the default allow-list
    f.proc.claimer.claim(time.time())
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    f.proc.sender.send_dead()
    f.publisher.poll()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    f.proc.settler.settle(time.time() + 1)
    assert [(p.topic, p.value) for p in f.publisher.produced] == [
        (f.settings.output_topic, b"late"), (f.settings.output_topic, b"later"), (f.settings.dlq_topic, b"elsewhere")]
    dead_headers = dict(f.publisher.produced[-1].headers)
    assert dead_headers["chronosError"].startswith(b"topic_not_allowed")
    assert f.state() == {} and f.proc.shared.held() == 0
    totals = f.proc.shared.totals
    assert (totals.claimed, totals.fired, totals.dead) == (3, 2, 1)


def test_a_published_row_a_peer_took_over_meanwhile_is_left_to_it_and_counted(caplog):
    f = Firer(CHRONOS_FIRER_CLAIM="stamp")
    f.add("slow")
    f.proc.claimer.claim(time.time())
    f.proc.sender.take_claimed()
    f.proc.sender.publish_due()
    detector, peer = MemoryStore(f.db, node_id=uuid.uuid4()), MemoryStore(f.db, node_id=uuid.uuid4())
    detector.reset_stale(detector.find_stale(-60_000))  # held past the hold time: handed back
    assert [r.id for r in peer.claim(10, 0)] == ["slow"]
    f.publisher.poll()
    f.proc.sender.hand_over()
    f.proc.settler.receive(0)
    caplog.set_level("WARNING", logger="chronos.firer")
    f.proc.settler.settle(time.time() + 1)
    assert f.db.rows["slow"].readied_by == peer.node_id  # the peer's claim stands
    totals = f.proc.shared.totals
    assert (totals.fired, totals.vanished, f.proc.shared.held()) == (1, 1, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "1 published rows were no longer ours to delete (taken over by a peer after the hold time)"]


def test_a_publish_refused_for_now_is_retried_later_and_one_refused_for_good_is_dead_lettered_then_parked():
    def refuse(topic, value):
        if value == b"later":
            return KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
        if value == b"huge":
            return KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)  # on its destination and on the dead-letter topic
        return None
    f = Firer(FakePublisher(refuse))
    f.add("later", "huge")
    cycle(f)
    assert [(p.topic, p.value) for p in f.publisher.produced] == [
        (f.settings.output_topic, b"later"), (f.settings.output_topic, b"huge"), (f.settings.dlq_topic, b"huge")]
    assert f.state() == {"later": "waiting"} and f.db.rows["later"].attempts == 1
    assert [p.message.message_id for p in f.db.parked] == ["huge"]
    assert f.proc.shared.held() == 0


def test_shutdown_hands_back_unpublished_rows_and_deletes_acknowledged_ones():
    f = Firer(CHRONOS_LOOKAHEAD_MS="60000", CHRONOS_HOLD_TIME_MS="130000", CHRONOS_FIRER_CLAIM="stamp")
    f.add("now")
    f.add("in-30s", due_in=30.0)  # claimed within the lookahead, published only at its deadline
    thread = threading.Thread(target=f.proc.run)
    thread.start()
    try:
        wait_for(lambda: f.proc.shared.totals.fired == 1, "the due row to be fired")
        assert f.state() == {"in-30s": "held"}
    finally:
        f.life.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert f.state() == {"in-30s": "waiting"}
    assert [p.value for p in f.publisher.produced] == [b"now"]
    totals = f.proc.shared.totals
    assert (totals.claimed, totals.fired, totals.released) == (2, 1, 1)


def test_rows_claimed_after_the_settler_ended_are_handed_back_on_a_store_of_the_sender_s_thread():
    f = Firer()
    f.add("late claim")
    rows = MemoryStore(f.db, node_id=f.node).claim(10, 0)
    f.proc.release_leftovers(rows)  # the settler never ran: it has ended
    assert f.state() == {"late claim": "waiting"} and f.proc.shared.totals.released == 1


def test_rows_left_while_the_settler_is_stuck_are_left_to_the_detector(caplog):
    stuck = threading.Event()
    unstuck = threading.Event()

    class StuckStore(MemoryStore):
        """A hand-back that hangs (PostgreSQL stuck) until the test lets it go."""

        def release(self, rows):
            stuck.set()
            unstuck.wait(TIMEOUT)
            return super().release(rows)

    f = Firer(store_class=StuckStore)
    f.add("a", "b")
    rows = MemoryStore(f.db, node_id=f.node).claim(10, 0)
    settler = f.proc.settler
    settler.start()
    settler.inbox.put(Outcomes(release=rows[:1]))
    settler.inbox.put(Stop())
    assert stuck.wait(TIMEOUT)
    caplog.set_level("WARNING", logger="chronos.firer")
    f.proc.release_leftovers(rows[1:])
    assert [r.getMessage() for r in caplog.records] == [
        "the settler has not ended: 1 held rows will be taken over after the hold time"]
    unstuck.set()
    settler.join(TIMEOUT)
    assert f.state() == {"a": "waiting", "b": "held"}


def test_the_settler_waits_out_a_postgres_outage_instead_of_spinning():
    settler = Firer().proc.settler
    settler.down_until = time.time() + 0.8
    settler.next_clock_sync = time.time() + 60
    settler.inbox.put(Outcomes(acked=[claimed("a", 0)]))
    settler.inbox.put(Outcomes(release=[claimed("b", 0)]))
    settler.receive(0)
    assert settler.wait_time() > 0.5
    settler.down_until = 0.0
    assert settler.wait_time() == 0.0  # reachable again: hand back at once


def test_the_sender_sleeps_at_least_a_tick_between_close_deadlines():
    sender = Firer().proc.sender
    sender.inbox.put((time.monotonic(), [claimed("a", time.time() + sender.timing.advance + 0.0003)]))  # due 0.3 ms from now
    sender.take_claimed()
    assert sender.wait_time() >= TICK
    sender = Firer().proc.sender
    sender.inbox.put((time.monotonic(), [claimed("a", time.time() + 0.5)]))
    sender.take_claimed()
    assert sender.wait_time() == IDLE_WAIT


def test_a_claim_or_delete_slow_enough_to_hold_up_firing_is_logged(caplog):
    recorded = []
    proc = Firer().proc
    proc.metrics.batch = lambda *a: recorded.append(a[:2])
    caplog.set_level("WARNING", logger="chronos.firer")
    proc.settler.measured("delete", 1000, time.perf_counter())
    assert not caplog.records
    proc.claimer.measured("claim", 2000, time.perf_counter() - SLOW_STATEMENT - 0.5)
    (record,) = caplog.records
    assert record.getMessage().startswith("slow claim: 1.5s for 2000 rows")
    assert recorded == [("delete", 1000), ("claim", 2000)]


def test_rows_claimed_longer_ago_than_three_quarters_of_the_hold_time_are_handed_back_unpublished(caplog):
    """A firer frozen past the hold time (a SIGSTOP, a frozen VM) finds rows a detector may have handed to
    a peer meanwhile: it publishes none of them, it hands them back (a no-op for rows a peer holds),
    and publishes rows claimed since as usual."""
    f = Firer(CHRONOS_HOLD_TIME_MS="4000")
    proc, now = f.proc, time.monotonic()
    proc.sender.inbox.put((now - 3.1, [claimed("old", time.time() - 1.0)]))  # claimed 3.1 s ago, limit 3 s
    proc.sender.inbox.put((now - 2.9, [claimed("recent", time.time() - 1.0)]))
    caplog.set_level("WARNING", logger="chronos.firer")
    proc.sender.take_claimed()
    proc.sender.publish_due()
    assert [m.value for m in f.publisher.produced] == [b"recent"]
    assert [r.id for r in proc.sender.done.release] == ["old"] and proc.shared.totals.expired == 1
    assert "1 held rows were claimed more than 3.0s ago" in caplog.text


def test_the_claimer_says_postgres_is_reachable_again_only_once_it_answered(caplog):
    """A pass of the claimer that runs no statement (claims paused while Kafka does not acknowledge) says
    nothing of PostgreSQL: during an outage it must not log that PostgreSQL is reachable again."""
    f = Firer()
    caplog.set_level("WARNING", logger="chronos.firer")
    claimer, shared = f.proc.claimer, f.proc.shared
    f.db.unavailable = "connection refused"
    claimer.start()
    try:
        wait_for(lambda: any("postgres unavailable" in r.getMessage() for r in caplog.records), "the outage log")
        shared.in_flight, shared.ack_progress = 1, time.monotonic() - 60  # Kafka silent: no claim is made
        wait_for(lambda: any("claiming nothing until Kafka catches up" in r.getMessage() for r in caplog.records),
                 "claims paused")
        passes = claimer.next_claim
        wait_for(lambda: claimer.next_claim > passes + 0.2, "passes of the claimer that claim nothing")
        assert not [r for r in caplog.records if "reachable again" in r.getMessage()]
        shared.in_flight = 0
        f.db.unavailable = None
        wait_for(lambda: any("postgres reachable again" in r.getMessage() for r in caplog.records),
                 "the end of the outage, once a claim ran")
    finally:
        claimer.stop()
        claimer.join(TIMEOUT)


def test_after_a_stall_the_claimer_claims_again_only_once_kafka_answers_a_request_of_its_own(caplog):
    """The producer was replaced because nothing was acknowledged (this host cut off from Kafka): its
    publishes were purged, none is in flight, yet Kafka is as far away as before. Claiming then would
    hold rows the firer cannot publish until a peer takes them, again and again; the claimer waits until
    Kafka answers a metadata request."""
    f = Firer()
    caplog.set_level("WARNING", logger="chronos.firer")
    f.add("a")
    claimer, shared = f.proc.claimer, f.proc.shared
    f.publisher.answering = False
    shared.kafka_stall_at = time.monotonic()
    claimer.claim(time.time())
    assert f.state() == {"a": "waiting"}
    claimer.next_kafka_probe = 0.0
    claimer.claim(time.time())  # asks again: still no answer
    assert f.state() == {"a": "waiting"}
    f.publisher.answering = True
    claimer.claim(time.time())  # within the second since it last asked: not yet
    assert f.state() == {"a": "waiting"}
    claimer.next_kafka_probe = 0.0
    claimer.claim(time.time())
    assert f.state() == {"a": "held"}
    assert [r.getMessage() for r in caplog.records] == ["Kafka answers again: claiming rows"]


def test_the_sender_tells_the_claimer_of_a_stall_until_kafka_acknowledges_again():
    f = Firer(CHRONOS_PUBLISH_STALL_MS="1000")
    sender, shared = f.proc.sender, f.proc.shared
    f.publisher.answering = False
    sender.inbox.put((time.monotonic(), [claimed("a", time.time() - 1)]))
    sender.take_claimed()
    sender.publish_due()
    assert shared.in_flight == 1
    sender.look_after_producer()  # publishes wait: the stall clock runs
    watch = sender.slot.watch
    watch.since -= 2.0  # nothing acknowledged for longer than the stall time (by a producer as old)
    watch.last_replacement -= 2.0
    watch.next_replacement -= 2.0
    sender.look_after_producer()
    assert shared.kafka_stall_at is not None and shared.in_flight == 0  # replaced: the publish purged
    f.publisher.answering = True
    sender.inbox.put((time.monotonic(), [claimed("b", time.time() - 1)]))
    sender.take_claimed()
    sender.publish_due()
    sender.slot.producer.poll(0)
    sender.look_after_producer()
    assert shared.kafka_stall_at is None


def test_the_settler_says_postgres_is_reachable_again_only_once_it_answered(caplog):
    """Its clock measurement failed (PostgreSQL away); its next passes have nothing to settle and no
    measurement due, so they run no statement: they must not say that PostgreSQL is reachable again."""
    f = Firer()
    caplog.set_level("WARNING", logger="chronos.firer")
    settler = f.proc.settler
    f.db.unavailable = "connection refused"
    settler.start()
    try:
        wait_for(lambda: any("postgres unavailable" in r.getMessage() for r in caplog.records), "the outage log")
        for _ in range(2):  # the second is taken only once the pass that took the first has ended
            settler.inbox.put(Outcomes())
            wait_for(lambda: settler.inbox.empty() and time.time() > settler.down_until, "a pass of the settler")
        assert not [r for r in caplog.records if "reachable again" in r.getMessage()]
        f.db.unavailable = None
        settler.next_clock_sync = 0.0
        settler.inbox.put(Outcomes())
        wait_for(lambda: any("postgres reachable again" in r.getMessage() for r in caplog.records),
                 "the end of the outage, once a statement ran")
    finally:
        settler.inbox.put(Stop())
        settler.join(TIMEOUT)
