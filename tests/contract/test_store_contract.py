"""The `Store` port's contract: every test runs against the PostgreSQL store (the embedded
PostgreSQL) and against the in-memory twin, through the port only (and `Backend`'s few ways
round it). Times are relative to the database's clock, far enough apart that PostgreSQL's moving
clock and the twin's still one agree."""

from __future__ import annotations

import random
import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest

from chronos import codec
from chronos.domain import cron
from chronos.domain.model import Parked, Row
from chronos.domain.ratelimit import FireRateLimits, TopicRates
from chronos.errors import StoreRejected


def row(mid, deadline_us, okey=None, value=b"v", *, topic=None, key=b"k", headers=b"", **kw) -> Row:
    return Row(str(mid), deadline_us, topic, key, value, headers, okey, kw.get("partition"), kw.get("cron"),
               kw.get("timezone"))


def insert(st, rows) -> int:
    return st.apply(rows, [], [])[0]


# -- the consumer's batch --------------------------------------------------------------------------

def test_insert_ignores_duplicate_ids_and_keeps_bytes(s, backend):
    t = backend.now_us() + 60_000_000
    assert insert(s, [row("m-1", t, key=None, value=None), row("m-2", t, value=b"\x00\xff")]) == 2
    assert insert(s, [row("m-1", t + 5, value=b"other"), row("m-3", t)]) == 1
    assert {m: backend.stored(m).value for m in backend.ids()} == {"m-1": None, "m-2": b"\x00\xff", "m-3": b"v"}


def test_apply_inserts_replaces_and_cancels_in_one_batch(s, backend):
    t = backend.now_us() + 60_000_000
    insert(s, [row("keep", t), row("old", t, value=b"old"), row("gone", t)])
    assert s.apply([row("keep", t + 1), row("new", t)], [row("old", t + 5, value=b"new"), row("fresh", t)],
                   ["gone", "unknown"]) == (1, 2, 1, 0)
    assert {m: backend.stored(m).value for m in backend.ids()} == {"keep": b"v", "new": b"v", "old": b"new",
                                                                    "fresh": b"v"}
    assert backend.stored("old").deadline_us == t + 5


def test_each_row_keeps_the_input_partition_it_was_read_from_on_every_way_in(s, backend):
    """Straight in (the COPY), through the staging table (a batch holding an id already waiting), replaced (the
    replace's partition: where the message comes from now), and none when not known."""
    t = backend.now_us() + 60_000_000
    assert insert(s, [row("a", t, partition=3), row("b", t, partition=0), row("c", t)]) == 3
    assert insert(s, [row("a", t, partition=9), row("d", t, partition=2**31 - 1)]) == 1
    assert s.apply([], [row("b", t + 5, partition=6), row("e", t, partition=1)], []) == (0, 2, 0, 0)
    assert {m: backend.stored(m).input_partition for m in backend.ids()} == \
        {"a": 3, "b": 6, "c": None, "d": 2**31 - 1, "e": 1}


def test_a_batch_replacing_one_id_twice_is_refused_whole(s, backend):
    t = backend.now_us() + 60_000_000
    with pytest.raises(StoreRejected):
        s.apply([row("a", t)], [row("b", t), row("b", t + 1)], [])
    assert backend.ids() == set()
    assert s.apply([row("a", t)], [], []) == (1, 0, 0, 0)  # and the store goes on


def test_waiting_ids_are_the_ids_the_store_holds_in_any_state(s, backend):
    now = backend.now_us()
    insert(s, [row("due", now - 1000), row("later", now + 60_000_000),
               row("sched", now + 3_600_000_000, cron="0 0 1 1 *")])
    s.claim(1, 0)
    assert s.waiting_ids(iter(["due", "later", "sched", "gone"])) == {"due", "later", "sched"}
    assert s.waiting_ids([]) == set()


def test_a_cancel_of_a_claimed_row_is_counted_apart_and_still_deletes_it(s, backend):
    """A firer claimed `held` within its lookahead: the cancel deletes it (a detector reset cannot
    bring it back) but says it found it in flight, since that firer may still publish it."""
    now = backend.now_us()
    insert(s, [row("held", now + 100_000), row("waiting", now + 60_000_000)])
    [held] = s.claim(10, 300)
    assert held.id == "held"
    assert s.apply([], [], ["held", "waiting", "unknown"]) == (0, 0, 1, 1)
    assert s.find_stale(-60_000) == []  # nothing left for a detector to hand back
    assert s.delete_fired([held]) == 0


def test_replacing_a_row_a_firer_holds_hands_the_new_version_back(s, backend):
    now = backend.now_us()
    insert(s, [row("x", now - 1000, value=b"v1")])
    held = s.claim(1, 0)
    s.apply([], [row("x", now - 500, value=b"v2")], [])
    assert s.delete_fired(held) == 0                      # the firer's delete leaves the new version
    (again,) = s.claim(1, 0)
    assert again.value == b"v2"


# -- the claim -------------------------------------------------------------------------------------

def test_claim_takes_due_rows_in_deadline_order_within_limit(s, backend):
    base = backend.now_us()
    insert(s, [row(f"m-{i}", base - 1_000_000 + i * 1000) for i in reversed(range(10))]
           + [row("m-99", base + 3_600_000_000)])
    first = s.claim(4, 0)
    assert [r.id for r in first] == ["m-0", "m-1", "m-2", "m-3"]
    assert first[0].deadline_us == base - 1_000_000 and first[0].value == b"v" and first[0].attempts == 0
    rest = s.claim(100, 0)
    assert [r.id for r in rest] == [f"m-{i}" for i in range(4, 10)]  # far-future row not claimed
    assert s.claim(100, 0) == []


def test_equal_deadlines_are_claimed_in_enqueue_order(s, backend):
    t = backend.now_us() - 1000
    insert(s, [row("b", t), row("a", t)])
    insert(s, [row("c", t)])
    assert [r.id for r in s.claim(1, 0)] == ["b"]
    assert [r.id for r in s.claim(10, 0)] == ["a", "c"]


def test_claim_lookahead_takes_rows_due_soon_and_never_a_later_one(s, backend):
    base = backend.now_us()
    insert(s, [row("m-1", base + 200_000), row("m-2", base + 5_000_000)])
    assert s.claim(10, 0) == []
    assert [r.id for r in s.claim(10, 1000)] == ["m-1"]


def test_a_claim_with_a_window_takes_only_rows_due_within_it(s, backend):
    base = backend.now_us()
    insert(s, [row("old", base - 10_000_000), row("recent", base - 1_000_000), row("soon", base + 200_000)])
    assert [r.id for r in s.claim(10, 1000, 2000)] == ["recent", "soon"]
    assert [r.id for r in s.claim(10, 1000)] == ["old"]  # without one, every due row


def test_a_row_due_before_the_window_still_holds_back_its_key(s, backend):
    base = backend.now_us()
    insert(s, [row("A-old", base - 10_000_000, "A"), row("A-new", base - 500_000, "A"), row("N", base - 400_000)])
    assert [r.id for r in s.claim(10, 0, 2000)] == ["N"]
    assert [r.id for r in s.claim(10, 0)] == ["A-old", "A-new"]


def test_two_competing_firers_never_claim_a_row_twice(backend):
    base = backend.now_us() - 1_000_000
    insert(backend.store(uuid.uuid4()), [row(f"m-{i}", base + i) for i in range(3000)])
    got: list[list[str]] = [[], [], []]
    stores = [backend.store(uuid.uuid4()) for _ in range(3)]

    def firer(n):
        while True:
            rows = stores[n].claim(50, 0)
            if not rows:
                break
            got[n].extend(r.id for r in rows)
            time.sleep(0)  # let the other threads in

    threads = [threading.Thread(target=firer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = got[0] + got[1] + got[2]
    assert len(every) == 3000 and len(set(every)) == 3000
    assert all(got), "every firer should have claimed something"


# -- after the publish: delete, hand back ---------------------------------------------------------------

def test_delete_only_rows_still_owned_as_claimed(backend):
    a, b, detector = backend.store(uuid.uuid4()), backend.store(uuid.uuid4()), backend.store()
    now = backend.now_us()
    insert(a, [row(f"m-{i}", now - 1000) for i in range(3)])
    claimed = a.claim(10, 0)
    assert len(claimed) == 3
    # a detector handed m-0 and m-1 back; a peer took m-0 over, m-1 is not claimed again yet
    detector.reset_stale([x for x in detector.find_stale(-60_000) if x.id in ("m-0", "m-1")])
    assert [r.id for r in b.claim(1, 0)] == ["m-0"]
    assert a.delete_fired(claimed) == 1
    assert backend.ids() == {"m-0", "m-1"}
    assert a.delete_fired(claimed) == 0


def test_release_hands_rows_back(s, backend):
    insert(s, [row("m-1", backend.now_us() - 1000)])
    claimed = s.claim(10, 0)
    assert s.claim(10, 0) == []
    assert s.release(claimed) == 1
    assert not backend.stored("m-1").claimed
    assert s.release(claimed) == 0   # handed back once
    again = s.claim(10, 0)
    assert [r.id for r in again] == ["m-1"]
    assert s.delete_fired(claimed) == 0   # the old claim is not this one
    assert s.delete_fired(again) == 1


def test_a_store_without_a_node_id_cannot_claim(backend):
    st = backend.store()
    assert st.claim(10, 0) == []
    insert(st, [row("m", backend.now_us() - 1000)])
    with pytest.raises(StoreRejected):
        st.claim(10, 0)
    assert not backend.stored("m").claimed


def test_empty_calls_change_nothing(s):
    assert s.apply([], [], []) == (0, 0, 0, 0)
    assert (s.delete_fired([]), s.release([]), s.retry_later([]), s.park_claimed([], "out")) == (0, 0, 0, 0)
    assert s.reset_stale([]) == []
    s.park([])


# -- the detector -----------------------------------------------------------------------------------

def test_detector_resets_only_rows_unchanged_since_seen(backend):
    firer, peer, det = backend.store(uuid.uuid4()), backend.store(uuid.uuid4()), backend.store()
    now = backend.now_us()
    insert(firer, [row(f"m-{i}", now - 1000) for i in range(3)])
    m0, m1, m2 = firer.claim(10, 0)
    seen = det.find_stale(hold_ms=-60_000)  # every claim, however recent
    assert sorted(x.id for x in seen) == ["m-0", "m-1", "m-2"]
    assert {x.readied_by for x in seen} == {firer.node_id}
    # between the read and the reset: m-0 fired and deleted, m-1 handed back and re-claimed by a peer
    assert firer.delete_fired([m0]) == 1
    assert firer.release([m1]) == 1
    assert [x.id for x in peer.claim(10, 0)] == ["m-1"]
    assert det.reset_stale(seen) == [firer.node_id]   # m-2 only
    assert backend.stored("m-1").claimed and not backend.stored("m-2").claimed
    assert firer.delete_fired([m2]) == 0
    assert det.reset_stale(seen) == []


def test_find_stale_lists_the_oldest_claims_first_up_to_its_limit(backend):
    a, b, det = backend.store(uuid.uuid4()), backend.store(uuid.uuid4()), backend.store()
    now = backend.now_us()
    insert(a, [row("old", now - 2000), row("new", now - 1000)])
    a.claim(1, 0)
    backend.age_claims(20)
    b.claim(1, 0)
    backend.age_claims(10)
    found = det.find_stale(5000)
    assert [(x.id, x.readied_by) for x in found] == [("old", a.node_id), ("new", b.node_id)]
    assert [x.id for x in det.find_stale(5000, limit=1)] == ["old"]
    assert [x.id for x in det.find_stale(25_000)] == ["old"]


# -- ordering keys ----------------------------------------------------------------------------------

def test_in_flight_row_holds_back_later_rows_of_its_key_only(backend):
    a, b = backend.store(uuid.uuid4()), backend.store(uuid.uuid4())
    t = backend.now_us() - 1000
    insert(a, [row("A1", t, "A"), row("A2", t, "A"), row("B1", t + 1, "B"), row("N1", t + 2)])
    first = a.claim(1, 0)
    assert [x.id for x in first] == ["A1"]
    assert [x.id for x in b.claim(10, 0)] == ["B1", "N1"]   # A2 waits for A1
    assert b.claim(10, 0) == []
    a.delete_fired(first)
    assert [x.id for x in b.claim(10, 0)] == ["A2"]


def test_a_chain_of_one_key_is_claimed_together_in_order(backend):
    a, b = backend.store(uuid.uuid4()), backend.store(uuid.uuid4())
    t = backend.now_us() - 1000
    insert(a, [row(f"A{i}", t, "A") for i in range(5)])
    got = a.claim(3, 0)
    assert [x.id for x in got] == ["A0", "A1", "A2"]
    assert b.claim(10, 0) == []  # A3 is behind rows a peer holds


def test_a_key_goes_by_deadline_and_a_row_not_yet_due_holds_back_nothing(s, backend):
    now = backend.now_us()
    insert(s, [row("A-later", now + 60_000_000, "A"), row("A-now", now - 1000, "A")])
    claimed = s.claim(10, 0)
    assert [x.id for x in claimed] == ["A-now"]      # deadline order within the key, not enqueue order
    assert s.claim(10, 90_000) == []                 # A-later waits for A-now, in flight
    s.delete_fired(claimed)
    insert(s, [row("B-later", now + 60_000_000, "B"), row("B-after", now + 120_000_000, "B")])
    assert [x.id for x in s.claim(10, 90_000)] == ["A-later", "B-later"]  # B-after beyond the lookahead


def test_a_recurring_schedule_does_not_hold_back_its_key(s, backend):
    t = backend.now_us()
    insert(s, [row("sched", t - 5_000_000, "A", cron="0 0 1 1 *"), row("A1", t - 1000, "A")])
    assert [x.id for x in s.claim(10, 0)] == ["A1"]


def test_killed_firer_mid_batch_keeps_the_order_of_its_key(backend):
    a, b, det = backend.store(uuid.uuid4()), backend.store(uuid.uuid4()), backend.store()
    t = backend.now_us() - 1000
    insert(a, [row(f"A{i}", t, "A") for i in range(4)])
    assert [x.id for x in a.claim(2, 0)] == ["A0", "A1"]   # a dies holding A0, A1
    assert b.claim(10, 0) == []
    assert det.reset_stale(det.find_stale(-60_000)) == [a.node_id] * 2   # the detector's reset
    assert [x.id for x in b.claim(10, 0)] == ["A0", "A1", "A2", "A3"]


def test_competing_firers_publish_each_key_in_enqueue_order(backend):
    keys = [f"key-{k}" for k in range(25)]
    t = backend.now_us() - 1000
    rows = [row(f"{k}-{i}", t, k) for i in range(12) for k in keys]   # equal deadlines: enqueue order decides
    insert(backend.store(uuid.uuid4()), rows)
    published: list[str] = []
    in_flight: dict[str, str] = {}
    lock = threading.Lock()
    errors: list[str] = []
    stores = [backend.store(uuid.uuid4()) for _ in range(3)]

    def firer(s):
        while True:
            got = s.claim(random.randint(1, 40), 0)
            if not got:
                with lock:
                    if len(published) == len(rows):
                        break
                time.sleep(0.001)
                continue
            with lock:
                for x in got:
                    key = x.id.rsplit("-", 1)[0]
                    holder = in_flight.setdefault(key, str(s.node_id))
                    if holder != str(s.node_id):
                        errors.append(f"{x.id} claimed while {holder} holds {key}")
                    published.append(x.id)
            time.sleep(random.random() / 500)
            with lock:  # released before the delete: a peer may claim the key's next row only after it
                for x in got:
                    in_flight.pop(x.id.rsplit("-", 1)[0], None)
            s.delete_fired(got)

    threads = [threading.Thread(target=firer, args=(st,)) for st in stores]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    assert sorted(published) == sorted(x.id for x in rows)
    for k in keys:
        order = [int(p.rsplit("-", 1)[1]) for p in published if p.rsplit("-", 1)[0] == k]
        assert order == list(range(12)), (k, order)


# -- publish failures: retry later, park ---------------------------------------------------------------

def test_retry_later_counts_the_failure_and_moves_the_row_out_of_the_claim(s, backend):
    due = backend.now_us() - 10_000_000  # earlier than make_due makes it
    insert(s, [row("bad", due, topic="t.x"), row("good", due + 1)])
    bad, good = s.claim(10, 0)
    assert (bad.attempts, bad.original_deadline_us) == (0, None)
    assert s.retry_later([(bad, "TOPIC_EXCEPTION: Broker: Invalid topic", 60_000)]) == 1
    s.release([good])
    # the failing row left the head of the claim: the row behind it is claimed, the failing one is not
    assert [r.id for r in s.claim(10, 0)] == ["good"]
    stored = backend.stored("bad")
    assert (stored.attempts, stored.last_error, stored.original_deadline_us, stored.claimed) == (
        1, "TOPIC_EXCEPTION: Broker: Invalid topic", due, False)
    assert 55_000_000 < stored.deadline_us - backend.now_us() <= 60_000_000
    # due again: claimed with its count and its deadline as scheduled, which a second retry keeps
    backend.make_due("bad")
    again, = s.claim(10, 0)
    assert (again.attempts, again.original_deadline_us, again.scheduled_us) == (1, due, due)
    assert s.retry_later([(again, "e2", 1000)]) == 1
    stored = backend.stored("bad")
    assert (stored.attempts, stored.last_error, stored.original_deadline_us) == (2, "e2", due)


def test_retry_later_moves_a_future_deadline_from_that_deadline(s, backend):
    soon = backend.now_us() + 30_000_000
    insert(s, [row("soon", soon)])
    held, = s.claim(10, 60_000)
    assert s.retry_later([(held, "refused", 10_000)]) == 1
    assert backend.stored("soon").deadline_us == soon + 10_000_000


def test_a_replace_starts_the_new_version_with_no_failed_publishes(s, backend):
    due = backend.now_us() - 1_000_000
    insert(s, [row("r", due, topic="t.bad", key=None, value=b"v1")])
    held, = s.claim(10, 0)
    s.retry_later([(held, "TOPIC_EXCEPTION", 60_000)])
    s.apply([], [row("r", due + 5, topic="t.good", key=None, value=b"v2")], [])
    # the new version is due as sent, with none of the old version's failures or backoff
    again, = s.claim(10, 0)
    assert (again.value, again.topic, again.attempts, again.original_deadline_us, again.scheduled_us) == (
        b"v2", "t.good", 0, None, due + 5)
    assert backend.stored("r").last_error is None


def test_retry_later_and_park_touch_only_rows_still_held_as_claimed(backend):
    a, b, det = backend.store(uuid.uuid4()), backend.store(uuid.uuid4()), backend.store()
    insert(a, [row("m", backend.now_us() - 1000, key=None)])
    held = a.claim(10, 0)
    det.reset_stale(det.find_stale(-60_000))   # a detector handed it to a peer
    b.claim(10, 0)
    assert a.retry_later([(held[0], "late news", 1000)]) == 0
    assert a.park_claimed([(held[0], "too_large: x")], "out") == 0
    assert backend.stored("m").attempts == 0 and backend.parked() == []


def test_a_row_in_backoff_still_holds_back_later_rows_of_its_key(s, backend):
    t = backend.now_us() - 2_000_000
    insert(s, [row(f"o-{i}", t + i * 1000, "K", key=None) for i in range(3)] + [row("free", t + 5000, key=None)])
    claimed = s.claim(10, 0)
    assert [r.id for r in claimed] == ["o-0", "o-1", "o-2", "free"]
    s.retry_later([(claimed[0], "refused", 60_000)])   # o-0 now waits a minute, its deadline moved past o-1's
    s.release(claimed[1:])
    assert [r.id for r in s.claim(10, 0)] == ["free"]
    assert s.claim(10, 0) == []
    # its backoff over: the key goes on in the order as scheduled, o-0 first
    backend.make_due("o-0")
    assert [r.id for r in s.claim(10, 0)] == ["o-0", "o-1", "o-2"]


def test_park_claimed_moves_the_row_with_its_deadline_as_scheduled(s, backend):
    due = backend.now_us() - 10_000_000  # earlier than make_due makes it
    headers = codec.encode_headers([("h", b"\x00\xff"), ("h", None)])
    insert(s, [row("big", due, key=None, value=b"x" * 1000, headers=headers), row("routed", due, topic="other",
                                                                                  value=None)])
    big, routed = s.claim(10, 0)
    s.retry_later([(big, "refused", 0)])  # parked after a retry: with the deadline as scheduled
    s.release([routed])
    backend.make_due("big")
    big, routed = sorted(s.claim(10, 0), key=lambda r: r.id)
    assert s.park_claimed([(big, "too_large: a; dead-letter topic: b"), (routed, "topic_not_allowed: c")],
                          "out") == 2
    assert backend.ids() == set()
    assert sorted(backend.parked()) == [
        ("big", "store/big", "out", due, None, b"x" * 1000, headers, "too_large: a; dead-letter topic: b"),
        ("routed", "store/routed", "other", due, b"k", None, b"", "topic_not_allowed: c")]
    assert s.overview(5000).parked == 2


def test_park_keeps_a_consumer_message(s, backend):
    s.park([Parked(None, "in/0/7", "dlq", None, None, b"v", codec.encode_headers([("a", b"b")]), "bad_id: x; y"),
            Parked("m-1", "in/1/3", "out", cron.from_us(1_700_000_000_000_001), b"k", b"v", b"", "too_large: z")])
    assert [p[:4] for p in backend.parked()] == [(None, "in/0/7", "dlq", None),
                                                 ("m-1", "in/1/3", "out", 1_700_000_000_000_001)]
    assert s.overview(5000).parked == 2


# -- status ---------------------------------------------------------------------------------------------

def test_overview_counts_waiting_due_in_flight_and_per_node(backend):
    a, b = sorted([backend.store(uuid.uuid4()), backend.store(uuid.uuid4())], key=lambda st: st.node_id)
    now = backend.now_us()
    insert(a, [row("d1", now - 20_000_000), row("d2", now - 10_000_000), row("d3", now - 5_000_000),
               row("later", now + 60_000_000), row("sched", now + 3_600_000_000, cron="0 0 1 1 *")])
    assert [x.id for x in a.claim(1, 0)] == ["d1"]
    backend.age_claims(10)
    assert [x.id for x in b.claim(1, 0)] == ["d2"]
    view = a.overview(5000, exact=True)
    assert abs(cron.to_us(view.at) - backend.now_us()) < 5_000_000
    assert (view.waiting, view.waiting_estimated, view.due, view.in_flight, view.past_hold_time) == (2, False, 1, 2, 1)
    assert (view.schedules, view.parked) == (1, 0)
    assert cron.to_us(view.next_deadline) == now + 60_000_000
    assert 19 < view.oldest_overdue_s < 60   # d1's lateness, claimed or not
    assert [(n.node, n.rows, n.past_hold_time, cron.to_us(n.oldest_deadline)) for n in view.by_node] == [
        (a.node_id, 1, 1, now - 20_000_000), (b.node_id, 1, 0, now - 10_000_000)]
    assert 9 < view.by_node[0].held_for_s < 60 and view.by_node[1].held_for_s < 5
    assert a.overview(5000).waiting == 2   # few rows: counted by default


def test_overview_of_an_empty_store(s):
    view = s.overview(5000)
    assert (view.waiting, view.due, view.in_flight, view.by_node, view.oldest_overdue_s, view.next_deadline,
            view.schedules, view.parked) == (0, 0, 0, [], None, None, 0, 0)


# -- recurring schedules ------------------------------------------------------------------------------

def schedule(st, sid, expr, deadline: datetime, tz=None, headers=None, value=b"tick"):
    insert(st, [row(sid, cron.to_us(deadline), value=value, headers=codec.encode_headers(headers or []),
                    cron=expr, timezone=tz)])


def test_due_schedule_creates_one_claimed_occurrence_and_moves_on(s, backend):
    now = cron.from_us(backend.now_us())
    due = now.replace(second=0, microsecond=0)
    schedule(s, "tick", "* * * * *", due, headers=[("h", b"1")])
    assert s.claim(10, 0) == []                 # the schedule row itself is never claimed
    (occ,) = s.claim_schedules(10, 0, cron.to_us(now))
    stamp = due.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    assert occ.id == f"tick@{stamp}" and occ.deadline_us == cron.to_us(due) and occ.value == b"tick"
    assert codec.decode_headers(occ.headers) == [("h", b"1"), ("chronosOccurrence", stamp.encode())]
    assert backend.stored(occ.id).claimed
    assert backend.stored("tick").deadline_us == cron.to_us(due + timedelta(minutes=1))
    assert s.claim_schedules(10, 0, cron.to_us(now)) == []
    assert s.delete_fired([occ]) == 1


def test_missed_occurrences_fire_once_the_latest(s, backend):
    now = cron.from_us(backend.now_us())
    three_hours_ago = (now - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    schedule(s, "ten", "*/10 * * * *", three_hours_ago)
    (occ,) = s.claim_schedules(10, 0, cron.to_us(now))
    latest = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0)
    assert occ.deadline_us == cron.to_us(latest)


def test_two_firers_never_create_the_same_occurrence_twice(backend):
    now = cron.from_us(backend.now_us())
    first = backend.store(uuid.uuid4())
    for i in range(50):
        schedule(first, f"s{i}", "* * * * *", now.replace(second=0, microsecond=0))
    got: list = []
    stores = [backend.store(uuid.uuid4()) for _ in range(4)]

    def firer(st):
        got.extend(st.claim_schedules(7, 0, cron.to_us(now)))

    threads = [threading.Thread(target=firer, args=(st,)) for st in stores]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ids = [o.id for o in got]
    ids += [o.id for o in first.claim_schedules(100, 0, cron.to_us(now))]
    assert len(ids) == 50 and len(set(ids)) == 50


def test_cancel_removes_a_schedule(s, backend):
    schedule(s, "daily", "0 9 * * *", cron.from_us(backend.now_us()) + timedelta(hours=1))
    assert s.overview(5000).schedules == 1
    assert s.apply([], [], ["daily"]) == (0, 0, 1, 0)
    assert s.overview(5000).schedules == 0


def test_a_schedule_with_a_bad_expression_is_cancelled_not_fired(s, backend, caplog):
    schedule(s, "broken", "61 * * * *", cron.from_us(backend.now_us() - 1000))
    assert s.claim_schedules(10, 0, backend.now_us()) == []
    assert backend.ids() == set()
    assert "recurring schedule broken has a bad expression" in caplog.text


LOOKAHEAD_MS = 300_000  # covers the schedule's next occurrence (at most ~3 minutes away), not the one after


def hourly_soon(now: int) -> tuple[str, int]:
    """An hourly expression whose next occurrence is 2-3 minutes after `now` (the one after is an
    hour later, outside the lookahead), and that occurrence."""
    minute = (cron.from_us(now).minute + 3) % 60
    expr = f"{minute} * * * *"
    return expr, cron.first_occurrence(expr, None, None, now)


def test_a_replace_after_the_occurrence_was_created_does_not_create_it_again(s, backend):
    """The firer created occurrence `id@T` within its lookahead and published it; then a replace
    arrives before T: the replacement's first occurrence from now is T again. It must not be
    created a second time (with the new value); the replacement applies from the next one."""
    now = backend.now_us()
    expr, due = hourly_soon(now)
    insert(s, [row("report", due, value=b"old", cron=expr)])
    first = s.claim_schedules(10, LOOKAHEAD_MS, now)
    assert [(c.id, c.value, c.deadline_us) for c in first] == [(f"report@{cron.from_us(due):%Y-%m-%dT%H:%M}:00.000000Z",
                                                                b"old", due)]
    s.delete_fired(first)  # published and acknowledged before the replace is stored
    replace_at = now + 1000
    s.apply([], [row("report", cron.first_occurrence(expr, None, None, replace_at), value=b"new", cron=expr)], [])
    assert s.claim_schedules(10, LOOKAHEAD_MS, replace_at) == []
    assert backend.stored("report").deadline_us == due + 3_600_000_000
    # the replacement fires from the next occurrence on
    [occ] = s.claim_schedules(10, 2 * 3_600_000, replace_at)
    assert (occ.value, occ.deadline_us) == (b"new", due + 3_600_000_000)


def test_a_replace_before_the_occurrence_is_created_applies_to_it(s, backend):
    now = backend.now_us()
    expr, due = hourly_soon(now)
    insert(s, [row("report", due, value=b"old", cron=expr)])
    s.apply([], [row("report", due, value=b"new", cron=expr)], [])
    [occ] = s.claim_schedules(10, LOOKAHEAD_MS, now)
    assert (occ.value, occ.deadline_us) == (b"new", due)


def test_a_replace_with_another_expression_skips_only_the_occurrences_already_created(s, backend):
    """The new expression's occurrences after the created one fire, even before the old next one."""
    now = backend.now_us()
    expr, due = hourly_soon(now)
    insert(s, [row("report", due, value=b"old", cron=expr)])
    [occ] = s.claim_schedules(10, LOOKAHEAD_MS, now)
    s.delete_fired([occ])
    every_minute = "* * * * *"
    s.apply([], [row("report", cron.first_occurrence(every_minute, None, None, now), value=b"new",
                     cron=every_minute)], [])
    assert s.claim_schedules(10, LOOKAHEAD_MS, now) == []  # skips to the first minute after `due`
    [occ] = s.claim_schedules(10, LOOKAHEAD_MS, now)
    assert (occ.value, occ.deadline_us) == (b"new", due + 60_000_000)


# -- fire-rate limits ---------------------------------------------------------------------------------------

OUT = "chronos.output"


def limits(**rates) -> FireRateLimits:
    return FireRateLimits(TopicRates(tuple((t.replace("_", "."), r) for t, r in rates.items())))


def test_two_firers_together_never_take_more_than_the_budget(backend):
    firers = [backend.store(uuid.uuid4()) for _ in range(2)]
    rate = 10.0   # capacity: one second of it, 10 rows
    base = backend.now_us() - 60_000_000
    insert(firers[0], [row(f"m-{i}", base + i, topic="fragile") for i in range(1000)])
    lim = limits(fragile=rate)
    taken: list[list] = [[], []]
    started = backend.now_us()
    rounds, step = 12, 1.0

    def both_claim():
        barrier = threading.Barrier(2)

        def one(k):
            barrier.wait()
            # several tries each, of 3 rows at most: whichever runs first cannot take all 10 tokens
            # alone, and the last tries find the bucket drained
            for _ in range(3):
                taken[k] += firers[k].claim_limited(lim, OUT, 3, 300)[0]
        threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    both_claim()
    for _ in range(rounds):
        backend.age_bucket("fragile", step)
        both_claim()
    real = (backend.now_us() - started) / 1e6
    ids = [r.id for r in taken[0] + taken[1]]
    assert len(ids) == len(set(ids)), "a row was claimed by both firers"
    budget = rate + rate * (rounds * step + real)   # a full bucket, then the rate over all time that passed
    assert len(ids) <= budget
    # and the budget is used: every refill finds due rows waiting
    assert len(ids) >= rate + rate * rounds * step
    assert taken[0] and taken[1], "both firers took part"


def test_held_back_rows_fire_in_deadline_order_and_never_early(s, backend):
    base = backend.now_us()
    deadlines = [base - 5_000_000 + i * 1000 for i in range(60)]
    random.Random(7).shuffle(deadlines)
    insert(s, [row(f"m-{i}", d, topic="fragile") for i, d in enumerate(deadlines)])
    insert(s, [row("m-soon", base + 30_000_000, topic="fragile")])   # within the lookahead given, not due
    lim = limits(fragile=10.0)
    claimed = []
    for _ in range(8):
        got = s.claim_limited(lim, OUT, 500, 60_000)[0]
        for r in got:
            assert r.deadline_us <= cron.to_us(r.readied_at), f"{r.id} claimed before its deadline"
        claimed += got
        backend.age_bucket("fragile", 1.0)
    assert [r.deadline_us for r in claimed] == sorted(deadlines)[:len(claimed)]
    assert len(claimed) == 60  # 10 at first, then 10 per second that passed
    assert "m-soon" not in {r.id for r in claimed}


def test_a_throttled_backlog_does_not_hold_up_other_topics(s, backend):
    base = backend.now_us()
    insert(s, [row(f"m-{i}", base - 10_000_000 + i, topic="fragile") for i in range(500)])
    insert(s, [row(f"o{i}", base - 1_000_000 + i) for i in range(50)])               # the output topic
    insert(s, [row(f"x{i}", base - 1_000_000 + i, topic="other") for i in range(50)])
    rows, full = s.claim_limited(limits(fragile=10.0), OUT, 200, 300)
    topics = [r.topic for r in rows]
    assert topics.count("fragile") == 10 and topics.count(None) == 50 and topics.count("other") == 50
    assert not full
    assert rows == sorted(rows, key=lambda r: (r.deadline_us, r.seq))


def test_the_default_and_patterns_limit_each_topic_apart(s, backend):
    base = backend.now_us()
    for topic in ("pay.eu", "pay.us", "misc"):
        insert(s, [row(f"{topic}-{i}", base - 1_000_000 + i, topic=topic) for i in range(100)])
    insert(s, [row(f"out-{i}", base - 1_000_000 + i) for i in range(100)])
    lim = FireRateLimits(TopicRates((("pay.*", 5.0), ("misc", None))), default=20.0)
    rows, _ = s.claim_limited(lim, OUT, 1000, 300)
    by_topic = {t: sum(1 for r in rows if r.topic == t) for t in ("pay.eu", "pay.us", "misc", None)}
    assert by_topic == {"pay.eu": 5, "pay.us": 5, "misc": 100, None: 20}


def test_an_ordering_key_waits_for_its_throttled_earlier_row(s, backend):
    base = backend.now_us()
    insert(s, [row(f"m-{i}", base - 10_000_000 + i, topic="fragile") for i in range(20)])
    insert(s, [row("m-first", base - 5_000_000, "K", topic="fragile"),
               row("m-second", base - 4_000_000, "K", topic="other")])
    rows, _ = s.claim_limited(limits(fragile=10.0), OUT, 200, 300)
    assert {r.id for r in rows} & {"m-first", "m-second"} == set()  # the first is behind the backlog


def test_throttled_backlog_and_lateness_per_limited_topic(backend):
    st, peer = backend.store(uuid.uuid4()), backend.store(uuid.uuid4())
    base = backend.now_us()
    insert(st, [row(f"m-{i}", base - 3_000_000 + i, topic="fragile") for i in range(30)])
    insert(st, [row(f"o{i}", base - 3_000_000) for i in range(5)])   # unlimited output topic: not listed
    insert(st, [row("later", base + 60_000_000, topic="slow")])     # limited, nothing due: no bucket written
    assert peer.throttled(OUT) == []                               # no firer limited anything yet
    st.claim_limited(limits(fragile=10.0, slow=1.0), OUT, 200, 300)
    # read from the buckets the firers keep: a reader needs no limits of its own
    (found,) = peer.throttled(OUT)
    assert (found.topic, found.rows, found.rate) == ("fragile", 20, 10.0)
    assert 2.5 < found.lateness_s < 60
    backend.age_bucket("fragile", 61)   # a limit no firer applied for a minute: no longer listed
    assert peer.throttled(OUT) == []


def test_the_output_topic_has_its_own_bucket(s, backend):
    base = backend.now_us()
    insert(s, [row(f"m-{i}", base - 1_000_000 + i) for i in range(30)])
    rows, _ = s.claim_limited(limits(chronos_output=5.0), OUT, 200, 300)
    assert len(rows) == 5
    (t,) = s.throttled(OUT)
    assert (t.topic, t.rows) == (OUT, 25)


def test_a_limited_backlog_is_drained_without_sleeping_only_while_the_batch_not_the_budget_ends_it(s, backend):
    base = backend.now_us()
    insert(s, [row(f"m-{i}", base - 1_000_000 + i, topic="fast") for i in range(500)])
    rows, full = s.claim_limited(limits(fast=1000.0), OUT, 100, 300)
    assert (len(rows), full) == (100, True)      # the batch ended it: claim again at once
    rows, full = s.claim_limited(limits(fast=1000.0), OUT, 1000, 300)
    assert len(rows) < 1000 and not full        # the budget (or the due rows) ended it: wait for the poll


def test_unlimited_topics_share_the_batch_so_one_backlog_does_not_starve_another(s, backend):
    base = backend.now_us()
    insert(s, [row(f"o{i}", base - 10_000_000 + i) for i in range(1000)])                 # older backlog
    insert(s, [row(f"x{i}", base - 1_000_000 + i, topic="other") for i in range(30)])
    insert(s, [row(f"f{i}", base - 1_000_000 + i, topic="fragile") for i in range(30)])
    rows, full = s.claim_limited(limits(fragile=5.0), OUT, 100, 300)
    topics = [r.topic for r in rows]
    assert (topics.count("fragile"), topics.count("other"), topics.count(None)) == (5, 30, 65)
    assert full


def test_a_keys_rows_leave_a_limited_topic_in_order_one_grant_at_a_time(backend):
    a, b = backend.store(uuid.uuid4()), backend.store(uuid.uuid4())
    base = backend.now_us()
    insert(a, [row(f"m-{i}", base - 5_000_000 + i * 1000, "K", topic="fragile") for i in range(6)])
    got = []
    for k in range(6):
        rows = (a, b)[k % 2].claim_limited(limits(fragile=1.0), OUT, 100, 300)[0]  # one token a second
        assert len(rows) == 1
        got += rows
        (a, b)[k % 2].delete_fired(rows)   # published: the next of the key may go
        backend.age_bucket("fragile", 1.0)
    assert [r.id for r in got] == [f"m-{i}" for i in range(6)]
