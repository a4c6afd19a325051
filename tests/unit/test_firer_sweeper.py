"""The sweeper (chronos.roles.firer.sweeper): with the claim that deletes, each claimer's full claims run on a
thread of their own, below the mark the claimer's last claim left, so a long walk of the due index never stops
the claims of the rows falling due."""

from __future__ import annotations

import threading
import time

from chronos.adapters.memory import MemoryTakes
from chronos.domain.model import Claimed, Mark
from chronos.errors import StoreUnavailable
from chronos.roles.firer.claiming import FULL_CLAIM_EVERY, RECENT_WINDOW_MS
from chronos.roles.firer.sweeper import IDLE_WAIT, SWEEP_MARGIN_MS
from test_roles_firer import TIMEOUT, Firer, wait_for


class SweepsSeen(MemoryTakes):
    """A session of the claim that deletes keeping (lookahead, window, after) of every claim; while `held_up`, a
    full one (no window) waits, as a long walk of the due index would, until `let_go` is set or it is cancelled."""

    claims: list[tuple[int, int | None, Mark | None]] = []
    held_up = False
    let_go = threading.Event()
    waiting = threading.Event()

    def claim_whole(self, limit: int, lookahead_ms: int, window_ms: int | None = None,
                    after: Mark | None = None) -> tuple[list[Claimed], bool]:
        self.claims.append((lookahead_ms, window_ms, after))
        if SweepsSeen.held_up and window_ms is None:
            SweepsSeen.waiting.set()
            assert SweepsSeen.let_go.wait(TIMEOUT), "the sweep was never let go"
            raise StoreUnavailable("canceling statement due to user request")
        return super().claim_whole(limit, lookahead_ms, window_ms, after)

    def cancel(self) -> None:
        SweepsSeen.let_go.set()


class SweepingFirer(Firer):
    def __init__(self, **env: str):
        SweepsSeen.claims, SweepsSeen.held_up = [], False
        SweepsSeen.let_go, SweepsSeen.waiting = threading.Event(), threading.Event()
        super().__init__(sweep=True, **env)
        self.sweeper = self.proc.sweepers[0]

    def takes(self) -> MemoryTakes:
        return SweepsSeen(self.db, node_id=self.node)


def test_with_the_claim_that_deletes_each_claimer_has_a_sweeper_and_no_other_claim_has_one():
    f = Firer(sweep=True, CHRONOS_FIRER_CLAIMERS="2")
    assert [s.name for s in f.proc.sweepers] == ["sweeper", "sweeper2"]
    assert [s.claimer for s in f.proc.sweepers] == f.proc.claimers and all(c.swept for c in f.proc.claimers)
    assert Firer(sweep=True, CHRONOS_FIRER_CLAIM="stamp").proc.sweepers == []  # the stamp's claimer runs its own
    assert Firer(sweep=True, CHRONOS_FIRE_RATE_LIMITS="orders=10").proc.sweepers == []  # topic by topic, no mark


def test_the_claimer_runs_no_full_claim_and_the_sweeper_takes_the_rows_below_its_mark():
    f = SweepingFirer()
    claimer, sweeper = f.proc.claimer, f.sweeper
    assert sweeper.sweep(time.monotonic()) == IDLE_WAIT and SweepsSeen.claims == []  # no mark yet: nothing to bound
    for _ in range(3):  # the last seq read three times: a claim that came back short leaves a mark
        claimer.next_seq_read = 0.0
        claimer.claim(time.time())
    f.add("late", due_in=-10.0)  # due long before the claimer's window
    f.add("now", due_in=-0.1)
    claimer.next_full_claim = 0.0  # a claimer of its own would run a full claim now
    claimer.claim(time.time())
    assert [c[1] for c in SweepsSeen.claims] == [RECENT_WINDOW_MS] * 4  # of the window each
    assert f.state() == {"late": "waiting", "now": "held"}
    now_row = f.db.rows["now"]
    assert claimer.swept_from == (None, (now_row.deadline_us, now_row.seq))
    f.add("past", due_in=0.0)  # due past the mark: the claimer's next claim takes it
    sent = time.monotonic()
    wait = sweeper.sweep(sent)
    lookahead, window, after = SweepsSeen.claims[-1]
    assert window is None and after is None  # from the head of the due index
    assert lookahead <= (now_row.deadline_us - time.time_ns() // 1000) // 1000 - SWEEP_MARGIN_MS + 1
    assert f.state() == {"late": "held", "now": "held", "past": "waiting"}
    assert sweeper.next_sweep == sent and wait <= 0  # it took a row due long ago: another sweep at once
    sweeper.sweep(time.monotonic())
    assert FULL_CLAIM_EVERY - 0.1 <= sweeper.next_sweep - time.monotonic() <= FULL_CLAIM_EVERY  # nothing more
    _, rows = f.proc.sender.inbox.get_nowait()
    _, swept = f.proc.sender.inbox.get_nowait()
    assert [r.id for r in rows] == ["now"] and [r.id for r in swept] == ["late"] and swept[0].batch
    assert f.proc.shared.held() == 2


def test_without_a_mark_the_sweep_reaches_to_the_start_of_the_claimer_s_window():
    f = SweepingFirer(CHRONOS_BATCH_SIZE="1")
    f.add("a", "b", due_in=-0.1)
    f.proc.claimer.claim(time.time())  # came back full: the mark is its row
    f.proc.claimer.cursor.after = None  # as after a claim that left a row of an ordering key behind
    f.proc.claimer.swept_from = (None, None)
    f.sweeper.sweep(time.monotonic())
    assert SweepsSeen.claims[-1] == (-RECENT_WINDOW_MS, None, None) and f.state()["b"] == "waiting"


def test_a_long_sweep_stops_neither_the_claims_nor_the_firer_s_stop():
    f = SweepingFirer(CHRONOS_POLL_INTERVAL_MS="20")
    f.add("first", due_in=-0.1)
    f.proc.claimer.claim(time.time())
    SweepsSeen.held_up = True  # every sweep now waits
    f.sweeper.start()
    assert SweepsSeen.waiting.wait(TIMEOUT)
    f.proc.claimer.start()
    f.add("second", due_in=0.0)
    wait_for(lambda: f.state()["second"] == "held", "the claimer's claim while the sweep runs")
    stopped = time.monotonic()
    f.proc.claimer.stop()
    f.sweeper.stop()  # cancels the sweep running
    f.sweeper.join(TIMEOUT)
    f.proc.claimer.join(TIMEOUT)
    assert not f.sweeper.is_alive() and not f.proc.claimer.is_alive() and time.monotonic() - stopped < 2.0
    assert f.sweeper.crashed is None and f.proc.shared.held() == 2  # the cancelled sweep holds nothing


def test_the_sweeper_holds_off_while_the_claimer_does():
    f = SweepingFirer()
    f.add("late", due_in=-10.0)
    f.proc.claimer.claim(time.time())
    f.proc.claimer.claims_paused = True  # Kafka keeps publishes waiting
    assert f.sweeper.sweep(time.monotonic()) == IDLE_WAIT and f.state()["late"] == "waiting"
    f.proc.claimer.claims_paused = False
    f.proc.shared.claims_resume_at = time.monotonic() + 60  # the producer is being replaced
    assert f.sweeper.sweep(time.monotonic()) == IDLE_WAIT and f.state()["late"] == "waiting"
    f.proc.shared.claims_resume_at = 0.0
    f.sweeper.sweep(time.monotonic())
    assert f.state()["late"] == "held"
