"""The firers' shares of the due rows (`chronos.domain.shares`), against the PostgreSQL store and the
in-memory twin: the leases, and the claim of a firer's own slices. The two stores cut the rows into
slices by different hashes, so the tests say which rows a firer gets only through the claims."""

from __future__ import annotations

import uuid

from chronos.domain.model import Mark, Row
from chronos.domain.shares import SLICES, slices_of

HOLD_MS = 5000
EVERY_SLICE = tuple(range(SLICES))


def row(mid, deadline_us, okey=None) -> Row:
    return Row(str(mid), deadline_us, None, b"k", b"v", b"", okey)


def two_firers(backend):
    """Two firers' stores, each with its slices as the division of the two gives them."""
    a, b = uuid.uuid4(), uuid.uuid4()
    return (backend.store(a), slices_of(a, [b])), (backend.store(b), slices_of(b, [a]))


def test_a_lease_makes_a_firer_live_to_the_others_until_it_expires_or_leaves(backend):
    a, b, c = (backend.store(uuid.uuid4()) for _ in range(3))
    assert a.firer_heartbeat(HOLD_MS) == {}
    assert list(b.firer_heartbeat(HOLD_MS)) == [a.node_id]
    assert sorted(c.firer_heartbeat(HOLD_MS)) == sorted([a.node_id, b.node_id])
    backend.age_leases(HOLD_MS / 1000 + 1)  # none renewed for longer than the hold time
    assert b.firer_heartbeat(HOLD_MS) == {}  # the expired leases are no firer's any more
    assert list(a.firer_heartbeat(HOLD_MS)) == [b.node_id]  # a firer that renews again is live again
    a.firer_leave()
    assert b.firer_heartbeat(HOLD_MS) == {}  # gone at once, not after the hold time
    a.firer_leave()  # leaving twice is no error


def test_each_live_firer_comes_with_its_lease_s_age_so_a_quiet_one_is_told_from_a_renewing_one(backend):
    a, b = backend.store(uuid.uuid4()), backend.store(uuid.uuid4())
    a.firer_heartbeat(HOLD_MS)
    assert 0 <= b.firer_heartbeat(HOLD_MS)[a.node_id] < 1000  # just renewed
    backend.age_leases(2.0)  # neither renewed for two seconds
    assert 2000 <= b.firer_heartbeat(HOLD_MS)[a.node_id] < 3000  # quiet for two seconds
    assert a.firer_heartbeat(HOLD_MS)[b.node_id] < 1000  # b renewed just now


def test_two_firers_claim_their_own_slices_disjoint_and_together_every_due_row(backend):
    now = backend.now_us()
    ids = {f"m-{i}" for i in range(200)}
    (a, mine_a), (b, mine_b) = two_firers(backend)
    a.apply([row(mid, now - 1000) for mid in sorted(ids)] + [row("later", now + 60_000_000)], [], [])
    got_a, _ = a.claim_share(mine_a, 1000, 300)
    got_b, _ = b.claim_share(mine_b, 1000, 300)
    ids_a, ids_b = {r.id for r in got_a}, {r.id for r in got_b}
    assert ids_a | ids_b == ids and not ids_a & ids_b
    assert 40 < len(ids_a) < 160  # the ids spread over the slices
    assert a.claim_share(mine_a, 1000, 300)[0] == []  # each drained its slices
    assert [(r.scheduled_us, r.seq) for r in got_a] == sorted((r.scheduled_us, r.seq) for r in got_a)


def test_a_claim_of_slices_takes_their_earliest_rows_and_one_past_a_mark_only_the_rows_after_it(backend):
    """As the claim of every slice (`claim_whole`): in (deadline, seq) order up to the limit, saying it took every
    row it chose; past a mark, without the last seq known, only rows after it in that order."""
    now = backend.now_us()
    s = backend.store(uuid.uuid4())
    s.apply([row(f"m-{i}", now - 1000 + i) for i in range(400)], [], [])
    rows, whole = s.claim_share(EVERY_SLICE, 32, 300)
    assert [r.id for r in rows] == [f"m-{i}" for i in range(32)] and whole
    last = rows[-1]
    s.apply([row("below", now - 2000)], [], [])  # below the mark, written since
    rest, _ = s.claim_share(EVERY_SLICE, 1000, 300, 2000, Mark(last.deadline_us, last.seq))
    assert [r.id for r in rest] == [f"m-{i}" for i in range(32, 400)]
    assert [r.id for r in s.claim_share(EVERY_SLICE, 1000, 300)[0]] == ["below"]  # the full claim finds it


def test_a_key_s_rows_are_in_one_slice_and_claimed_in_their_order(backend):
    now = backend.now_us()
    (a, mine_a), (b, mine_b) = two_firers(backend)
    a.apply([row(f"k-{i}", now - 5000 + i, okey="key") for i in range(6)], [], [])
    got_a, _ = a.claim_share(mine_a, 100, 300)
    got_b, _ = b.claim_share(mine_b, 100, 300)
    [(got)] = [g for g in (got_a, got_b) if g]
    assert [r.id for r in got] == [f"k-{i}" for i in range(6)]


def test_a_claim_of_recent_deadlines_leaves_the_older_rows_to_a_full_one(backend):
    now = backend.now_us()
    s = backend.store(uuid.uuid4())
    s.apply([row("old", now - 10_000_000), row("recent", now - 1000)], [], [])
    rows, _ = s.claim_share(EVERY_SLICE, 100, 300, window_ms=2000)
    assert [r.id for r in rows] == ["recent"]
    rows, _ = s.claim_share(EVERY_SLICE, 100, 300)
    assert [r.id for r in rows] == ["old"]


def test_the_others_overdue_rows_are_claimed_with_a_negative_lookahead(backend):
    """How a firer whose slices are drained takes what their owner left overdue: the claim of every
    slice, bounded to rows due at least that long ago."""
    now = backend.now_us()
    s = backend.store(uuid.uuid4())
    s.apply([row("overdue", now - 10_000_000), row("just-due", now - 1000)], [], [])
    assert [r.id for r in s.claim(100, -1000)] == ["overdue"]
