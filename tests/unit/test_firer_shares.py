"""Firers that divide the due rows (`chronos.domain.shares`): which slices are a firer's, when it takes
the others' rows; and the claimer doing so on the in-memory store, beside a second firer."""

from __future__ import annotations

import time
import uuid

import pytest

from chronos import codec
from chronos.adapters.memory import MemoryDatabase, MemoryStore
from chronos.adapters.memory.shares import slice_of
from chronos.domain.model import Mark, Row
from chronos.roles.firer.claimer import SEQ_READ_EVERY
from chronos.roles.firer.claiming import RECENT_WINDOW_MS
from chronos.domain.shares import (LEASES_AGAIN_S, SLICES, Shares, claimer_slices, overdue_ms, quiet_slices,
                                   slice_span, slices_of, strays_every)
from test_roles_firer import Firer, TakesSeen, TakingFirer

NODES = sorted(uuid.uuid4() for _ in range(4))


def test_a_firer_alone_owns_every_slice():
    assert slices_of(NODES[0], []) is None
    assert slices_of(NODES[0], [NODES[0]]) is None  # itself among the live ones


def test_the_live_firers_divide_the_slices_between_them_the_same_way_whoever_works_it_out():
    for n in (2, 3, 4):
        live = NODES[:n]
        division = [slices_of(me, [o for o in live if o != me]) for me in live]
        owned = [s for mine in division for s in mine or ()]
        assert sorted(owned) == list(range(SLICES))  # every slice once
        assert max(map(len, division)) - min(map(len, division)) <= 1  # as evenly as they go
        # the i-th firer by node id owns the i-th run of consecutive slices: the same whatever order they are
        # seen in
        assert division[1] == slices_of(live[1], reversed(live))
        assert all(list(mine or ()) == list(range(min(mine or (0,)), max(mine or (0,)) + 1)) for mine in division)
    assert slices_of(NODES[0], NODES[:3]) == (0, 1, 2, 3, 4, 5) and slices_of(NODES[1], NODES[:3]) == (6, 7, 8, 9, 10)


def test_a_firer_s_claimers_split_its_slices_into_runs_and_a_claimer_left_without_one_claims_nothing():
    assert claimer_slices((5, 6, 7, 8, 9), 0, 2) == (5, 6, 7) and claimer_slices((5, 6, 7, 8, 9), 1, 2) == (8, 9)
    assert claimer_slices(None, 1, 4) == (4, 5, 6, 7)
    assert claimer_slices((3,), 0, 2) == (3,) and claimer_slices((3,), 1, 2) == ()  # the first claimer's


def test_a_claim_of_slices_is_a_range_of_the_due_index_and_a_mask_of_those_within_it_that_are_its_own():
    assert slice_span((5, 6, 7)) == (5, 7, 0b11100000)
    assert slice_span((9, 2, 3)) == (2, 9, 0b1000001100)  # the quiet firers' slices need not be one run


def test_rows_of_another_firer_are_overdue_two_poll_intervals_after_their_deadline():
    assert overdue_ms(100) == 200


def test_the_lease_is_renewed_every_half_second_or_quarter_hold_time_and_says_when_the_firers_changed():
    me, other = NODES[0], NODES[1]
    shares = Shares(me, hold_time_ms=5000)
    assert shares.renewal_due(0.0) and shares.mine is None
    assert shares.renewed({other: 0}, 10.0)  # one firer became two
    assert shares.mine == slices_of(me, [other]) and not shares.renewal_due(10.4) and shares.renewal_due(10.5)
    assert not shares.renewed({other: 0, me: 0}, 10.5)  # still two (itself among the live ones counts once)
    assert shares.renewed({}, 11.0) and shares.mine is None  # the other gone: every slice is its own
    assert Shares(me, hold_time_ms=1000).renew_every == 0.25


def test_a_firer_takes_others_rows_only_in_a_full_pass_with_its_own_slices_drained_and_others_live():
    shares = Shares(NODES[0], 5000)
    assert not shares.takes_others(full_pass=True, own_backlog=False)  # alone: its claim is every slice's
    assert shares.takes_others(full_pass=True, own_backlog=False, claimers=2)  # but it has another claimer
    shares.renewed({NODES[1]: 0}, 0.0)
    assert shares.takes_others(full_pass=True, own_backlog=False)
    assert not shares.takes_others(full_pass=True, own_backlog=True)  # its own come first
    assert not shares.takes_others(full_pass=False, own_backlog=False)  # overdue rows are old: full passes only



def test_a_firer_whose_lease_was_not_renewed_for_three_renewals_has_gone_quiet_and_its_slices_are_taken():
    me, late, hung = NODES[0], NODES[1], NODES[2]
    shares = Shares(me, 5000)  # renewed every 0.5 s: quiet after 1.5 s
    shares.renewed({late: 400, hung: 1600}, 0.0)
    assert shares.quiet == slices_of(hung, [me, late]) == quiet_slices(me, {late: 400, hung: 1600}, 1500)
    assert shares.taken_slices() == shares.quiet  # a peer only late is not taken from: the two would race
    shares.renewed({late: 1499, hung: 10}, 1.0)  # the hung one renews again
    assert shares.quiet == () and shares.taken_slices() == ()


def test_the_first_of_several_claimers_takes_the_others_slices_as_well_as_the_quiet_firers():
    me, hung = NODES[0], NODES[1]
    shares = Shares(me, 5000)
    shares.renewed({hung: 2000}, 0.0)
    mine = slices_of(me, [hung])
    assert mine is not None
    siblings = set(mine) - set(claimer_slices(mine, 0, 2))
    assert set(shares.taken_slices(claimers=2)) == siblings | set(shares.quiet)
    alone = Shares(me, 5000)
    assert set(alone.taken_slices(claimers=2)) == set(range(SLICES)) - set(claimer_slices(None, 0, 2))


# -- the claimer, beside a second firer ------------------------------------------------------------

def add(db: MemoryDatabase, ids: list[str], due_in: float) -> None:
    deadline = int((time.time() + due_in) * 1e6)
    MemoryStore(db).apply([Row(i, deadline, None, b"k", i.encode(), codec.encode_headers([])) for i in ids], [], [])


def with_peer(**env: str) -> tuple[Firer, MemoryStore]:
    """A firer and a peer firer's store on the same database, the peer's lease made first. A poll interval of
    a second unless given: rows due now become another firer's to take only two intervals past their deadline,
    so a test slowed down by a busy machine does not see its peer's rows taken as overdue."""
    f = Firer(**{"CHRONOS_POLL_INTERVAL_MS": "1000", **env})
    peer = MemoryStore(f.db, node_id=uuid.uuid4())
    peer.firer_heartbeat(f.settings.hold_time_ms)
    return f, peer


def test_beside_a_live_peer_the_claimer_claims_only_its_own_slices_and_leaves_the_peer_s_rows_due_now():
    f, peer = with_peer()
    ids = [f"m{i}" for i in range(64)]
    add(f.db, ids, due_in=-0.05)
    f.proc.claimer.claim(time.time())
    mine = set(slices_of(f.node, [peer.node_id]) or ())
    held = {mid for mid, state in f.state().items() if state == "held"}
    assert held == {mid for mid in ids if slice_of(f.db.rows[mid]) in mine}
    assert 0 < len(held) < len(ids)


def test_beside_a_peer_a_claim_of_its_own_slices_starts_where_the_last_ended_until_the_division_changes():
    """As a firer alone's claim does (ClaimCursor): past the last row it took, within its own slices. Once the
    division changes, rows of slices newly its own may lie below that mark: the next claim is of the window."""
    TakesSeen.claims = []
    f = TakingFirer(CHRONOS_POLL_INTERVAL_MS="1000", CHRONOS_BATCH_SIZE="4")
    peer = MemoryStore(f.db, node_id=uuid.uuid4())
    peer.firer_heartbeat(f.settings.hold_time_ms)
    mine = slices_of(f.node, [peer.node_id])
    add(f.db, [f"m{i}" for i in range(200)], due_in=-0.05)  # one deadline: in seq order
    own = sorted((mid for mid in f.db.rows if slice_of(f.db.rows[mid]) in (mine or ())), key=lambda m: f.db.rows[m].seq)
    claimer = f.proc.claimer
    claimer.claim(time.time())  # the first claim is a full one, and comes back full
    last = f.db.rows[own[3]]
    claimer.claim(time.time())
    assert TakesSeen.claims == [(None, None), (RECENT_WINDOW_MS, Mark(last.deadline_us, last.seq))]
    assert {mid for mid, state in f.state().items() if state == "held"} == set(own[:8])
    for node in f.db.firers:  # the peer stopped renewing a hold time ago: every slice is this firer's now
        if node != f.node:
            f.db.firers[node] -= f.settings.hold_time_ms * 1000 + 1
    assert claimer.shares is not None
    claimer.shares.next_renewal = 0.0
    claimer.claim(time.time())
    assert TakesSeen.claims[-1] == (RECENT_WINDOW_MS, None) and claimer.cursor.slices is None


def test_once_its_own_slices_are_drained_a_full_claim_takes_the_rows_a_quiet_peer_left_overdue():
    f, peer = with_peer(CHRONOS_POLL_INTERVAL_MS="100")
    f.db.firers[peer.node_id] -= 2_000_000  # the peer has not renewed its lease for two seconds
    overdue = [f"late{i}" for i in range(32)]
    add(f.db, overdue, due_in=-(overdue_ms(100) / 1000 + 0.5))
    f.proc.claimer.claim(time.time())  # the first claim is a full one
    assert set(f.state().values()) == {"held"}  # its own slices', and the quiet peer's overdue ones


def test_between_full_claims_the_rows_a_quiet_peer_left_overdue_are_taken_every_half_second():
    """The others' overdue rows are looked for every SEQ_READ_EVERY, not only at the full claims (every
    FULL_CLAIM_EVERY): a quiet peer's rows wait no longer for them."""
    f, peer = with_peer(CHRONOS_POLL_INTERVAL_MS="100")
    claimer = f.proc.claimer
    claimer.claim(time.time())  # the first claim is a full one
    f.db.firers[peer.node_id] -= 2_000_000  # the peer has not renewed its lease for two seconds
    overdue = [f"late{i}" for i in range(32)]
    add(f.db, overdue, due_in=-(overdue_ms(100) / 1000 + 0.5))
    claimer.shares.next_renewal = 0.0  # the lease renewed: the quiet peer seen
    claimer.claim(time.time())
    assert "waiting" in f.state().values()  # before the beat: its own slices' rows only
    assert claimer.next_full_claim - time.monotonic() > SEQ_READ_EVERY
    claimer.next_seq_read = time.monotonic()  # SEQ_READ_EVERY went by, the full claim still ahead
    claimer.claim(time.time())
    assert set(f.state().values()) == {"held"}


def test_the_rows_of_a_peer_only_late_are_left_to_it_until_overdue_by_the_hold_time():
    f, peer = with_peer(CHRONOS_POLL_INTERVAL_MS="100")  # the peer renewed its lease just now
    late = [f"late{i}" for i in range(32)]
    add(f.db, late, due_in=-(overdue_ms(100) / 1000 + 0.5))
    claimer = f.proc.claimer
    claimer.claim(time.time())
    mine = set(claimer.shares.mine or ())
    assert {mid for mid, state in f.state().items() if state == "held"} == \
        {mid for mid in late if slice_of(f.db.rows[mid]) in mine}  # the peer's are its own to claim
    forgotten = [f"old{i}" for i in range(32)]  # due a hold time ago: its owner serves nothing
    add(f.db, forgotten, due_in=-(f.settings.hold_time_ms / 1000 + 0.5))
    claimer.next_full_claim = 0.0
    claimer.claim(time.time())
    peers = [mid for mid in forgotten if slice_of(f.db.rows[mid]) not in mine]
    assert peers and not any(f.state()[mid] == "held" for mid in peers)  # the last look for them was just now
    claimer.next_full_claim = claimer.next_strays = 0.0  # a quarter of the hold time later
    claimer.claim(time.time())
    assert all(f.state()[mid] == "held" for mid in forgotten)


def test_rows_overdue_by_the_hold_time_are_looked_for_once_a_quarter_hold_time_unless_the_look_came_back_full():
    f, peer = with_peer(CHRONOS_POLL_INTERVAL_MS="100", CHRONOS_BATCH_SIZE="8", CHRONOS_FIRER_CLAIM="stamp")
    claimer = f.proc.claimer
    looks: list[int] = []
    claim = claimer.store.claim

    def counted(limit, lookahead_ms, window_ms=None):
        if lookahead_ms == -f.settings.hold_time_ms:
            looks.append(limit)
        return claim(limit, lookahead_ms, window_ms)
    claimer.store.claim = counted
    for _ in range(3):  # three full passes, one after another, with nothing overdue
        claimer.next_full_claim = 0.0
        claimer.claim(time.time())
    assert len(looks) == 1
    assert claimer.next_strays - time.monotonic() == pytest.approx(strays_every(f.settings.hold_time_ms), abs=0.5)
    forgotten = [f"old{i}" for i in range(64)]
    add(f.db, forgotten, due_in=-(f.settings.hold_time_ms / 1000 + 0.5))
    mine = set(claimer.shares.mine or ())
    for mid in [mid for mid in forgotten if slice_of(f.db.rows[mid]) in mine]:
        del f.db.rows[mid]  # only the peer's rows: its own would be claimed first, as a backlog
    claimer.next_full_claim = claimer.next_strays = 0.0
    claimer.claim(time.time())   # a look that comes back full ...
    claimer.next_full_claim = 0.0
    claimer.claim(time.time())   # ... looks again at the next full pass
    assert len(looks) == 3


def test_a_peer_whose_lease_expired_loses_its_slices_at_the_next_renewal():
    f, peer = with_peer()
    claimer = f.proc.claimer
    claimer.claim(time.time())
    assert claimer.shares is not None and claimer.shares.mine is not None
    for node in f.db.firers:  # the peer stopped renewing a hold time ago (dead, or hung)
        if node != f.node:
            f.db.firers[node] -= f.settings.hold_time_ms * 1000 + 1
    claimer.shares.next_renewal = 0.0  # its renewal is due
    add(f.db, [f"m{i}" for i in range(32)], due_in=-0.05)
    claimer.claim(time.time())
    assert claimer.shares.mine is None and set(f.state().values()) == {"held"}


def test_a_claimer_that_stops_gives_its_share_up():
    f, peer = with_peer()
    f.proc.claimer.claim(time.time())
    assert f.node in f.db.firers
    f.proc.claimer.stop()
    f.proc.claimer.run()  # the loop ends at once: stop was asked
    assert f.node not in f.db.firers and peer.firer_heartbeat(f.settings.hold_time_ms) == {}


def test_a_schema_without_leases_makes_the_firer_claim_every_slice_and_look_again_later():
    me, peer = uuid.uuid4(), uuid.uuid4()
    shares = Shares(me, hold_time_ms=5000)
    shares.renewed({peer: 0}, now=100.0)
    assert shares.mine is not None and shares.leases
    shares.without_leases(now=101.0)
    assert shares.mine is None and not shares.leases and shares.firers == 1
    assert not shares.renewal_due(101.0 + LEASES_AGAIN_S - 0.1) and shares.renewal_due(101.0 + LEASES_AGAIN_S)
    shares.renewed({peer: 0}, now=200.0)  # the store migrated since: the leases again
    assert shares.leases and shares.mine == slices_of(me, [peer])
