"""A firer's claimers (CHRONOS_FIRER_CLAIMERS): each claims its own part of the firer's slices on a store of
its own, so one's claim is on its way while another's rows are published; the first also takes what the
others leave overdue; one cap on held rows for them all; the stop cancels every claim running."""

from __future__ import annotations

import threading
import time

from chronos.adapters.memory import MemoryStore
from chronos.adapters.memory.shares import slice_of
from chronos.domain.shares import SLICES, claimer_slices, overdue_ms, slices_of
from chronos.errors import StoreUnavailable
from test_firer_shares import add, with_peer
from test_roles_firer import TIMEOUT, Firer, wait_for


class HeldUpStore(MemoryStore):
    """A claim of slices that waits, as one behind a lock in PostgreSQL would, while `let_go` is set on
    this handle and until the test sets it, or the claim is cancelled (then it fails, as a cancelled
    statement does)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.let_go: threading.Event | None = None
        self.waiting = threading.Event()
        self.cancelled = False

    def claim_share(self, *args, **kwargs):
        if self.let_go is not None:
            self.waiting.set()
            assert self.let_go.wait(TIMEOUT), "the claim was never let go"
            if self.cancelled:
                raise StoreUnavailable("canceling statement due to user request")
        return super().claim_share(*args, **kwargs)

    def cancel(self) -> None:
        self.cancelled = True
        if self.let_go is not None:
            self.let_go.set()


def held(f: Firer) -> set[str]:
    return {mid for mid, state in f.state().items() if state == "held"}


def in_slices(f: Firer, ids: list[str], slices: tuple[int, ...]) -> set[str]:
    return {mid for mid in ids if slice_of(f.db.rows[mid]) in slices}


def test_a_claimer_claims_its_run_of_the_firer_s_slices():
    assert claimer_slices(None, 0, 2) == tuple(range(0, SLICES // 2))
    assert claimer_slices(None, 1, 2) == tuple(range(SLICES // 2, SLICES))
    assert claimer_slices((1, 5, 9, 13), 1, 2) == (9, 13)
    assert claimer_slices((3,), 1, 2) == ()  # fewer slices than claimers: this one claims none
    parts = [claimer_slices(None, part, 3) for part in range(3)]
    assert sorted(s for part in parts for s in part) == list(range(SLICES))  # disjoint, and every slice


def test_a_firer_runs_two_claimers_by_default_and_one_under_fire_rate_limits():
    f = Firer(CHRONOS_FIRER_CLAIMERS="2")
    assert [c.name for c in f.proc.claimers] == ["claimer", "claimer2"] and f.proc.claimers[0] is f.proc.claimer
    assert len({id(c.store) for c in f.proc.claimers}) == 2  # a connection each
    assert len(Firer(CHRONOS_FIRER_CLAIMERS="2", CHRONOS_FIRE_RATE_LIMITS="orders=10").proc.claimers) == 1


def test_each_claimer_of_a_firer_alone_claims_its_own_half_of_the_slices():
    f = Firer(CHRONOS_FIRER_CLAIMERS="2")
    ids = [f"m{i}" for i in range(64)]
    add(f.db, ids, due_in=-0.05)
    first, second = f.proc.claimers
    second.claim(time.time())
    assert held(f) == set()  # whose slices are the firer's is known once the first claimer renewed the lease
    first.claim(time.time())
    assert held(f) == in_slices(f, ids, claimer_slices(None, 0, 2)) != set()
    second.claim(time.time())
    assert held(f) == set(ids)


def test_beside_a_peer_the_claimers_divide_the_firer_s_own_slices():
    f, peer = with_peer(CHRONOS_FIRER_CLAIMERS="2")
    ids = [f"m{i}" for i in range(64)]
    add(f.db, ids, due_in=-0.05)
    first, second = f.proc.claimers
    mine = slices_of(f.node, [peer.node_id])
    first.claim(time.time())
    assert held(f) == in_slices(f, ids, claimer_slices(mine, 0, 2)) != set()
    second.claim(time.time())
    assert held(f) == in_slices(f, ids, mine)  # the peer's rows, due now, are left to the peer


def test_only_the_first_claimer_takes_what_the_others_left_overdue():
    f = Firer(CHRONOS_FIRER_CLAIMERS="2", CHRONOS_POLL_INTERVAL_MS="100")
    first, second = f.proc.claimers
    first.claim(time.time())  # the lease renewed, nothing due
    first.next_full_claim = second.next_full_claim = 0.0  # both claims full ones
    ids = [f"late{i}" for i in range(64)]
    add(f.db, ids, due_in=-(overdue_ms(100) / 1000 + 0.5))
    second.claim(time.time())
    assert held(f) == in_slices(f, ids, claimer_slices(None, 1, 2))  # its own, not the first's overdue ones
    f.db.rows.clear()
    add(f.db, ids, due_in=-(overdue_ms(100) / 1000 + 0.5))
    first.claim(time.time())
    assert held(f) == set(ids)  # its own, and the second's it left overdue


def test_a_claim_held_up_on_one_claimer_stops_neither_the_other_s_claims_nor_the_firer_s_stop():
    f = Firer(store_class=HeldUpStore, CHRONOS_FIRER_CLAIMERS="2", CHRONOS_POLL_INTERVAL_MS="20", CHRONOS_FIRER_CLAIM="stamp")
    stuck = f.proc.claimers[1].store
    assert isinstance(stuck, HeldUpStore)
    stuck.let_go = threading.Event()
    ids = [f"m{i}" for i in range(64)]
    add(f.db, ids, due_in=-0.01)
    thread = threading.Thread(target=f.proc.run)
    thread.start()
    try:
        # the first claimer's own rows at once; the second's too, once overdue, while its claim still waits
        wait_for(lambda: f.proc.shared.totals.fired == len(ids), "every row to be fired")
        assert stuck.waiting.is_set() and not stuck.let_go.is_set()
        assert sorted(p.value.decode() for p in f.publisher.produced) == sorted(ids)
    finally:
        f.life.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive() and stuck.cancelled  # the stop cancelled the claim held up
    assert not any(c.is_alive() for c in f.proc.claimers)


def test_the_claimers_share_one_cap_on_held_rows():
    batch = 8  # a row for each of a claimer's eight slices
    f = Firer(store_class=HeldUpStore, CHRONOS_FIRER_CLAIMERS="2", CHRONOS_BATCH_SIZE=str(batch),
              CHRONOS_FIRER_CLAIM="stamp")
    first, second = f.proc.claimers
    shared, cap = f.proc.shared, first.max_held
    add(f.db, [f"m{i}" for i in range(8 * cap)], due_in=-0.05)
    first.claim(time.time())
    for _ in range(cap):
        if shared.held() >= cap - batch:
            break
        second.claim(time.time())
    assert shared.held() == cap - batch
    assert isinstance(first.store, HeldUpStore)
    first.store.let_go = threading.Event()
    on_its_way = threading.Thread(target=first.claim, args=(time.time(),))
    on_its_way.start()
    try:
        assert first.store.waiting.wait(TIMEOUT)
        now = time.time()
        second.claim(now)  # the first's claim on its way has the cap's last room set aside
        assert shared.held() == cap - batch and shared.reserved == batch and second.next_claim == now + 0.005
    finally:
        first.store.let_go.set()
        on_its_way.join(TIMEOUT)
    assert shared.held() == cap and shared.reserved == 0
    second.claim(time.time())
    assert shared.held() == cap
