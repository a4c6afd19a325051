"""The claim that deletes (`ports.TakeStore`, CHRONOS_FIRER_CLAIM=delete), on PostgreSQL and on the in-memory
twin: a session's claims hold the rows they take until it commits (`finish`) or rolls back (`give_back`);
held, a row is in flight to everyone else (claims skip it, a cancel and the operators' actions leave it to its
firer, status and the listings say so), and a write of its id waits for the hold to end, never lost."""

from __future__ import annotations

import threading
import uuid

import pytest

from chronos.domain import cron
from chronos.domain.operators import Filters
from chronos.domain.ratelimit import FireRateLimits, TopicRates
from chronos.errors import StoreUnavailable
from test_store_contract import OUT, insert, row


@pytest.fixture
def t(backend):
    """A firer's session for the claim that deletes."""
    return backend.takes(uuid.uuid4())


def test_a_take_deletes_due_rows_in_deadline_order_within_limit_and_a_commit_makes_it_final(s, t, backend):
    base = backend.now_us()
    insert(s, [row(f"m-{i}", base - 1_000_000 + i * 1000, value=f"v{i}".encode()) for i in reversed(range(5))]
           + [row("later", base + 3_600_000_000)])
    taken = t.claim(3, 0)
    assert [r.id for r in taken] == ["m-0", "m-1", "m-2"]
    assert (taken[0].deadline_us, taken[0].value, taken[0].attempts) == (base - 1_000_000, b"v0", 0)
    assert abs(cron.to_us(taken[0].readied_at) - base) < 5_000_000   # when the claim's transaction began
    assert backend.ids() == {"m-0", "m-1", "m-2", "m-3", "m-4", "later"}  # still there until the commit
    t.finish([], [], [], OUT)
    assert backend.ids() == {"m-3", "m-4", "later"}


def test_held_rows_are_no_other_claims_and_a_give_back_returns_them_as_they_were(s, t, backend):
    base = backend.now_us()
    insert(s, [row("a", base - 2000, "K"), row("b", base - 1000)])
    before = {m: backend.stored(m) for m in ("a", "b")}
    assert [r.id for r in t.claim(10, 0)] == ["a", "b"]
    assert s.claim(10, 0) == []                                  # a firer that stamps
    other = backend.takes(uuid.uuid4())
    assert other.claim(10, 0) == [] and other.claim_share(tuple(range(16)), 10, 0)[0] == []
    other.give_back()
    t.give_back()
    assert {m: backend.stored(m) for m in ("a", "b")} == before
    assert [r.id for r in s.claim(10, 0)] == ["a", "b"]


def test_a_second_take_in_the_same_transaction_adds_to_the_batch(s, t, backend):
    base = backend.now_us()
    insert(s, [row("a", base - 2000), row("b", base - 1000)])
    assert [r.id for r in t.claim(1, 0)] == ["a"]
    assert [r.id for r in t.claim(1, 0)] == ["b"]
    t.give_back()
    assert backend.ids() == {"a", "b"}
    assert [r.id for r in t.claim(10, 0)] == ["a", "b"]   # and the next batch takes them again
    t.finish([], [], [], OUT)
    assert backend.ids() == set()


def test_a_held_row_holds_back_later_rows_of_its_key(s, t, backend):
    base = backend.now_us()
    insert(s, [row("K-1", base - 3000, "K"), row("K-2", base - 2000, "K"), row("N", base - 1000)])
    assert [r.id for r in t.claim(1, 0)] == ["K-1"]
    other = backend.takes(uuid.uuid4())
    assert [r.id for r in other.claim(10, 0)] == ["N"]
    assert s.claim(10, 0) == []
    t.finish([], [], [], OUT)
    assert [r.id for r in s.claim(10, 0)] == ["K-2"]
    other.give_back()


def test_finish_puts_back_hands_back_retries_and_parks_in_its_commit(s, t, backend):
    base = backend.now_us()
    insert(s, [row("fired", base - 4000), row("back", base - 3000, "K", value=b"b"),
               row("retry", base - 2000, value=b"r"), row("park", base - 1000, value=b"p", topic="elsewhere")])
    before = {m: backend.stored(m) for m in ("back", "retry")}
    taken = {r.id: r for r in t.claim(10, 0)}
    assert set(taken) == {"fired", "back", "retry", "park"}
    t.finish([taken["back"]], [(taken["retry"], "refused: X", 60_000)], [(taken["park"], "too_large: Y")], OUT)
    assert backend.ids() == {"back", "retry"}
    assert backend.stored("back") == before["back"]                 # as it was, its place in its key kept
    retried = backend.stored("retry")
    assert (retried.attempts, retried.last_error, retried.original_deadline_us) == (1, "refused: X", base - 2000)
    assert retried.seq == before["retry"].seq and retried.deadline_us >= backend.now_us() + 50_000_000
    [parked] = backend.parked()
    assert parked[:4] == ("park", "store/park", "elsewhere", base - 1000) and parked[5] == b"p"
    assert parked[7] == "too_large: Y"
    assert [r.id for r in s.claim(10, 0)] == ["back"]


def test_a_row_put_back_after_a_retry_keeps_its_place_in_its_key(s, t, backend):
    base = backend.now_us()
    insert(s, [row("K-1", base - 2000, "K"), row("K-2", base - 1000, "K")])
    first = t.claim(1, 0)
    t.finish([], [(first[0], "refused: X", 60_000)], [], OUT)
    assert s.claim(10, 0) == []   # K-1 waits out its backoff, and holds K-2 back meanwhile


def test_a_transaction_ended_by_the_server_fails_its_commit_and_its_rows_are_back(s, t, backend):
    base = backend.now_us()
    insert(s, [row("a", base - 1000)])
    [a] = t.claim(10, 0)
    backend.end(t)
    with pytest.raises(StoreUnavailable):
        t.finish([], [], [], OUT)
    assert [r.id for r in s.claim(10, 0)] == ["a"]
    t.give_back()                                 # nothing held: nothing to do
    insert(s, [row("b", base - 500)])
    assert [r.id for r in t.claim(10, 0)] == ["b"]   # and the session takes the next batch on a new transaction
    t.finish([], [], [], OUT)
    assert backend.ids() == {"a"}


# -- everyone else's view of held rows ------------------------------------------------------------------

def test_held_rows_are_in_flight_to_status_listings_and_actions(s, t, backend):
    base = backend.now_us()
    insert(s, [row("held", base - 20_000_000), row("due", base - 10_000_000), row("later", base + 60_000_000)])
    assert [r.id for r in t.claim(1, 0)] == ["held"]
    view = s.overview(5000, exact=True)
    assert (view.waiting, view.due, view.in_flight, [n.rows for n in view.by_node]) == (2, 1, 1, [1])
    assert view.by_node[0].node == t.node_id and cron.to_us(view.by_node[0].oldest_deadline) == base - 20_000_000
    assert s.present(["held", "due", "gone"]) == {"held": True, "due": False}
    shown = s.show("held", output_topic=OUT)
    assert (shown.state, shown.firer) == ("in_flight", t.node_id)
    listed = {m.id: (m.state, m.firer) for m in s.list_messages(Filters(), output_topic=OUT, limit=10)}
    assert listed == {"held": ("in_flight", t.node_id), "due": ("waiting", None), "later": ("waiting", None)}
    assert [m.id for m in s.list_messages(Filters(state="in_flight"), output_topic=OUT, limit=10)] == ["held"]
    assert [m.id for m in s.list_messages(Filters(state="waiting"), output_topic=OUT, limit=10)] == ["due", "later"]
    assert [m.state for m in s.list_messages(Filters(id_prefix="hel"), output_topic=OUT, limit=10)] == ["in_flight"]
    for action in ("cancel", "fire_now", "reschedule"):
        at = None if action == "cancel" else cron.from_us(base)
        assert s.apply_action(action, ["held"], at, counted=True) == []
    t.give_back()
    assert s.present(["held"]) == {"held": False}
    assert s.overview(5000, exact=True).in_flight == 0


def test_a_cancel_of_a_held_row_leaves_it_to_its_firer_and_says_it_was_in_flight(s, t, backend):
    base = backend.now_us()
    insert(s, [row("held", base - 2000), row("waiting", base + 60_000_000)])
    assert [r.id for r in t.claim(10, 0)] == ["held"]
    assert s.apply([], [], ["held", "waiting", "unknown"]) == (0, 0, 1, 1)
    t.finish([], [], [], OUT)                       # published: gone
    assert backend.ids() == set()


def test_an_id_read_again_while_its_row_is_held_is_left_alone_without_waiting(s, t, backend):
    base = backend.now_us()
    insert(s, [row("held", base - 2000, value=b"first")])
    [held] = t.claim(10, 0)
    consumer = backend.intake()
    assert consumer.apply([row("held", base - 2000, value=b"again"), row("new", base + 60_000_000)], [], []) == \
        (1, 0, 0, 0)
    t.give_back()
    assert backend.stored("held").value == b"first" and backend.ids() == {"held", "new"}


@pytest.mark.parametrize("ending", ["committed", "given_back"])
def test_a_replace_of_a_held_row_is_written_once_the_hold_ends_and_fires(s, t, backend, ending):
    """The new version is stored either way: the old one published and gone (the replace inserts it anew),
    or handed back (the replace overwrites it), as a replace of a stamped row in flight is."""
    base = backend.now_us()
    insert(s, [row("x", base - 2000, value=b"v1")])
    [held] = t.claim(10, 0)
    consumer = backend.intake()
    done: list = []
    writer = threading.Thread(target=lambda: done.append(consumer.apply([], [row("x", base - 1000, value=b"v2")], [])))
    writer.start()
    backend.wait_blocked()
    if ending == "committed":
        t.finish([], [], [], OUT)
    else:
        t.give_back()
    writer.join(30)
    assert done == [(0, 1, 0, 0)]
    assert backend.stored("x").value == b"v2"
    [again] = s.claim(10, 0)
    assert (again.id, again.value, again.attempts) == ("x", b"v2", 0)


# -- fire-rate limits ----------------------------------------------------------------------------------

def test_limited_takes_set_tokens_aside_apart_and_give_back_what_they_did_not_use(s, t, backend):
    base = backend.now_us() - 60_000_000
    insert(s, [row(f"m-{i}", base + i, topic="fragile") for i in range(3)])
    lim = FireRateLimits(TopicRates((("fragile", 10.0),)))   # a bucket of 10
    taken, backlog = t.claim_limited(lim, OUT, 100, 300, s)
    assert [r.id for r in taken] == ["m-0", "m-1", "m-2"] and not backlog
    t.finish([], [], [], OUT)
    insert(s, [row(f"n-{i}", base + i, topic="fragile") for i in range(20)])
    taken, _ = t.claim_limited(lim, OUT, 100, 300, s)
    assert len(taken) == 7    # 3 of the 10 tokens used, none given back twice, none lost
    t.give_back()


def test_a_grant_held_by_another_firer_is_not_spent_twice(s, backend):
    base = backend.now_us() - 60_000_000
    insert(s, [row(f"m-{i}", base + i, topic="fragile") for i in range(30)])
    lim = FireRateLimits(TopicRates((("fragile", 10.0),)))
    first, second = backend.takes(uuid.uuid4()), backend.takes(uuid.uuid4())
    other = backend.store(uuid.uuid4())
    other.db_clock_us()   # connected before the clock starts
    started = backend.now_us()
    a, _ = first.claim_limited(lim, OUT, 6, 300, s)
    b, _ = second.claim_limited(lim, OUT, 6, 300, other)
    refilled = 10.0 * (backend.now_us() - started) / 1e6    # tokens the rate added meanwhile
    assert len(a) == 6 and not {r.id for r in a} & {r.id for r in b}
    assert len(a) + len(b) <= 10 + refilled and len(b) >= 4   # the second had what the first left, no more
    first.give_back()
    second.give_back()
