"""A move's statements (`ports.MoveStore`) on PostgreSQL and on the in-memory twin: the move's record and lease,
the watch that notes a moving partition's rows as they are written, the copy's walk, the freeze, the rows handed
over and the schedules shipped, and in the cell a partition goes to, the rows put dormant and woken."""

from __future__ import annotations

import uuid

import pytest

from chronos.domain.cells import MOVING, CellPartition as P
from chronos.domain.moves import COPYING, CUTTING_OVER, MovingRow
from test_store_contract import insert, row

HOUR = 3_600_000_000


def scan_all(st, partition: int, after_us: int, stretch: int = 1000, calls: list[int] | None = None) -> list[MovingRow]:
    rows, cursor = [], 0
    while cursor is not None:
        found, cursor = st.scan(partition, cursor, after_us, stretch)
        rows += found
        if calls is not None:
            calls.append(len(found))
    return rows


def moving(mid: str, deadline_us: int, partition: int = 1, **kw) -> MovingRow:
    return MovingRow(mid, deadline_us, kw.get("topic"), b"k", kw.get("value", b"v"), b"", kw.get("okey"), partition,
                     None, None, None, kw.get("seq", 1), deadline_us - HOUR, kw.get("attempts", 0))


def test_a_move_is_recorded_once_and_run_by_one_node_while_its_lease_lives(s, backend):
    a, b = uuid.uuid4(), uuid.uuid4()
    assert s.moves() == []
    s.begin_move(3, "cell2", a, 10_000)
    s.begin_move(3, "other", b, 0)  # recorded already: left as it is
    (move,) = s.moves()
    assert (move.partition, move.target, move.step, move.cursor, move.node) == (3, "cell2", COPYING, 0, a)
    assert backend.now_us() + 5_000_000 < move.horizon_us <= backend.now_us() + 11_000_000
    assert s.lease_move(3, a, 60_000) and not s.lease_move(3, b, 60_000)
    assert not s.save_move(3, b, CUTTING_OVER, 7)
    assert s.save_move(3, a, CUTTING_OVER, 7)
    backend.age_moves(120)  # its runner died two minutes ago: another takes it over
    assert s.lease_move(3, b, 60_000) and not s.save_move(3, a, COPYING, 0)
    (move,) = s.moves()
    assert (move.step, move.cursor, move.node) == (CUTTING_OVER, 7, b)
    assert not s.lease_move(9, a, 60_000)  # no such move
    s.end_move(3)
    assert s.moves() == []


def test_the_watch_notes_the_partitions_rows_written_since_and_forgets_only_what_did_not_change_again(s, backend):
    t = backend.now_us() + HOUR
    insert(s, [row("before", t, partition=1)])
    s.begin_move(1, "cell2", uuid.uuid4(), 0)  # as a move begins: recorded, then watched
    assert s.watch(1)
    assert s.changes(1, 100) == []
    insert(s, [row("a", t, partition=1), row("b", t, partition=1), row("other", t, partition=0)])
    assert s.apply([], [row("before", t + 5, value=b"new", partition=1)], []) == (0, 1, 0, 0)
    changes = s.changes(1, 100)
    assert {c.id: c.row.value for c in changes} == {"a": b"v", "b": b"v", "before": b"new"}
    s.forget(1, changes[:2])
    assert {c.id for c in s.changes(1, 100)} == {changes[2].id}
    s.forget(1, changes)
    assert s.changes(1, 100) == []
    # deleted, or replaced into another partition: gone from this one; changed again before it is forgotten: kept
    seen = s.apply([], [row("b", t, partition=0)], ["a"]) and s.changes(1, 100)
    assert {(c.id, c.row) for c in seen} == {("a", None), ("b", None)}
    assert s.apply([], [row("b", t, partition=1, value=b"back")], []) == (0, 1, 0, 0)
    s.forget(1, seen)
    assert [(c.id, c.row.value) for c in s.changes(1, 100)] == [("b", b"back")]
    # a firer's claim and delete of a due row are changes too
    insert(s, [row("due", backend.now_us() - 1000, partition=1)])
    s.forget(1, s.changes(1, 100))
    (claimed,) = s.claim(10, 0)
    assert [(c.id, c.row is not None) for c in s.changes(1, 100)] == [("due", True)]
    s.delete_fired([claimed])
    assert [(c.id, c.row) for c in s.changes(1, 100)] == [("due", None)]
    # the move forgotten, its watch left in place (its table's lock never free at once): nothing noted any more
    s.end_move(1)
    insert(s, [row("after", t, partition=1)])
    assert s.apply([], [row("b", t, partition=1, value=b"again")], []) == (0, 1, 0, 0)
    assert s.changes(1, 100) == []
    assert s.unwatch(1)


def test_the_copy_walks_the_partitions_rows_due_after_the_horizon(s, backend):
    t = backend.now_us() + HOUR
    insert(s, [row(f"m{i}", t + i, partition=1 if i % 3 else 2, value=b"v%d" % i, okey=f"k{i % 2}") for i in range(3000)])
    insert(s, [row("soon", t - HOUR + 60_000_000, partition=1), row("daily", t, partition=1, cron="0 9 * * *"),
               row("unknown", t)])
    rows = scan_all(s, 1, t - HOUR // 2)
    assert sorted(r.id for r in rows) == sorted(f"m{i}" for i in range(3000) if i % 3)
    m1 = next(r for r in rows if r.id == "m1")
    assert (m1.deadline_us, m1.value, m1.ordering_key, m1.input_partition, m1.cron, m1.attempts) == \
        (t + 1, b"v1", "k1", 1, None, 0)
    # a shorter stretch asked: more, smaller steps, the same rows
    short: list[int] = []
    assert sorted(r.id for r in scan_all(s, 1, t - HOUR // 2, 100, short)) == sorted(r.id for r in rows)
    assert len(short) >= 10 and max(short) < 1000
    assert scan_all(s, 5, 0) == []


def test_rows_put_dormant_wait_for_the_move_to_wake_them_and_a_message_of_the_targets_own_is_kept(s, backend):
    now = backend.now_us()
    insert(s, [row("mine", now + HOUR, partition=1, value=b"mine")])
    assert s.put([moving("due", now - 1000, seq=70), moving("later", now + HOUR, seq=71),
                  moving("mine", now + HOUR, value=b"copy"), moving("other", now - 1000, partition=2)],
                 dormant=True) == 3
    assert backend.stored("mine").value == b"mine"
    # no firer claims them, no detector hands them back, an operator's action leaves them alone (in flight)
    assert s.claim(10, 0) == [] and s.find_stale(-60_000) == []
    assert s.present(["due", "later"]) == {"due": True, "later": True}
    assert s.held(1, backend.now_us() + HOUR) == 0
    # put again (a copy carried over anew) overwrites a dormant copy; dropped, only a dormant one goes
    assert s.put([moving("later", now + HOUR, value=b"v2")], dormant=True) == 1
    assert backend.stored("later").value == b"v2"
    assert s.drop_copies(["later", "mine", "nothing"]) == 1
    assert backend.ids() == {"mine", "due", "other"}
    # woken: up to a deadline, that partition's only
    assert s.wake(1, now, 100).count == 1
    (claimed,) = s.claim(10, 0)
    assert (claimed.id, claimed.seq) == ("due", 70)
    assert s.wake(2, None, 100).count == 1 and [c.id for c in s.claim(10, 0)] == ["other"]
    # put live: waiting at once
    assert s.put([moving("live", now - 500, seq=3)], dormant=False) == 1
    assert [c.id for c in s.claim(10, 0)] == ["live"]


def test_a_wake_goes_on_from_where_the_last_batch_ended_and_from_the_first_finds_a_row_put_behind_it(s, backend):
    t = backend.now_us() + HOUR
    assert s.put([moving(f"d{i}", t + i * 1000) for i in range(5)], dormant=True) == 5
    first = s.wake(1, None, 2)
    assert first.count == 2 and first.resume is not None
    # a row put dormant behind where the batches stand: passed over from there, found from the first
    assert s.put([moving("behind", t - 1000)], dormant=True) == 1
    second = s.wake(1, None, 2, first.resume)
    assert second.count == 2 and second.resume is not None and second.resume > first.resume
    assert s.wake(1, None, 2, second.resume).count == 1
    assert s.wake(1, None, 2, second.resume) == s.wake(2, None, 2) == type(first)(0, None)
    assert s.present(["behind", "d4"]) == {"behind": True, "d4": False}  # still dormant (held by the move)
    assert s.wake(1, None, 2).count == 1
    assert s.present(["behind"]) == {"behind": False}
    assert s.wake(1, None, 2) == type(first)(0, None)


def test_a_consumers_cancel_or_replace_reaches_a_dormant_row(s, backend):
    now = backend.now_us()
    s.put([moving("x", now + HOUR), moving("y", now + HOUR)], dormant=True)
    assert s.apply([], [row("x", now - 1000, value=b"replaced", partition=1)], ["y"])[1:3] in ((1, 0), (1, 1))
    assert backend.ids() == {"x"} and backend.stored("x").value == b"replaced"
    assert [c.id for c in s.claim(10, 0)] == ["x"]


def test_the_freeze_closes_the_partition_and_holds_its_rows_while_a_firer_settles_what_it_held(backend):
    firer = backend.store(uuid.uuid4())
    firer.open_partitions([0, 1], 1)
    now = backend.now_us()
    insert(firer, [row("held", now - 3000, partition=1), row("p1", now - 2000, partition=1),
                   row("p0", now - 1000, partition=0), row("gone", now - 500, partition=1)])
    held = [c for c in firer.claim(1, 0)]
    assert [c.id for c in held] == ["held"] and firer.held(1, now + HOUR) == 1
    assert firer.freeze(1) == 2 and firer.freeze(1) == 2  # closed once
    assert firer.cell_partitions() == [P(0, 1), P(1, 2, MOVING)]
    assert [c.id for c in firer.claim(10, 0)] == ["p0"]  # the partition's rows are no firer's any more
    # nor a writer's that does not check the map
    assert firer.apply([], [row("p1", now + HOUR, partition=1, value=b"new")], ["gone"]) == (0, 0, 0, 0)
    assert backend.stored("p1").value == b"v" and "gone" in backend.ids()
    # but the firer that held a row settles it: a hand-back leaves it here, frozen too
    assert firer.release(held) == 1 and firer.held(1, now + HOUR) == 0
    assert firer.claim(10, 0) == []
    given: list[MovingRow] = []
    assert firer.hand_over(1, now - 1500, 10, given.extend) == 2
    assert [r.id for r in given] == ["held", "p1"] and backend.ids() == {"p0", "gone"}


def test_a_partition_its_cell_does_not_list_is_not_frozen(s):
    s.open_partitions([0], 1)
    with pytest.raises(LookupError, match="does not list partition 5"):
        s.freeze(5)
    assert s.cell_partitions() == [P(0, 1)]


def test_a_firer_deletes_a_row_it_held_once_the_partition_froze(backend):
    firer = backend.store(uuid.uuid4())
    firer.open_partitions([1], 1)
    insert(firer, [row("held", backend.now_us() - 1000, partition=1)])
    held = firer.claim(10, 0)
    firer.freeze(1)
    assert firer.delete_fired(held) == 1 and backend.ids() == set()


@pytest.mark.parametrize("ends", ["commits", "rolls back"])
def test_a_row_a_claim_that_deletes_holds_is_held_until_its_transaction_ends_and_never_handed_over_meanwhile(
        backend, ends):
    firer = backend.store(uuid.uuid4())
    firer.open_partitions([0, 1], 1)
    now = backend.now_us()
    insert(firer, [row("held", now - 3000, partition=1), row("free", now - 2000, partition=1),
                   row("other", now - 1000, partition=0)])
    assert firer.watch(1)  # as a move begins: with its freeze, which holds nothing while the partition is open
    takes = backend.takes(uuid.uuid4())
    assert [(c.id, c.input_partition) for c in takes.claim(1, 0)] == [("held", 1)]
    # the freeze changes the map alone, and goes through while the firer's transaction is open (no lock of the
    # table, which that transaction holds, and which every write would wait behind): the cut-over then waits for
    # the rows held
    assert firer.freeze(1) == 2
    # still there to every other session, but the firer's: in flight, never handed over to another cell
    assert firer.held(1, now + HOUR) == 1 and firer.held(0, now + HOUR) == 0
    given: list[MovingRow] = []
    assert firer.hand_over(1, now + HOUR, 10, given.extend) == 1 and [r.id for r in given] == ["free"]
    assert firer.held(1, now - 5000) == 0  # looked for among the rows due up to then
    if ends == "commits":  # published: gone from the cell
        takes.finish([], [], [], "out")
        assert backend.ids() == {"other"}
    else:  # handed back, or its firer gone silent: back, with its partition, and handed over as any other
        takes.give_back()
        assert backend.stored("held").input_partition == 1
        assert firer.hand_over(1, now + HOUR, 10, given.extend) == 1 and [r.id for r in given] == ["free", "held"]
    assert firer.held(1, now + HOUR) == 0


def test_rows_are_handed_over_only_once_the_cell_they_go_to_has_them(backend):
    st = backend.store(uuid.uuid4())
    st.open_partitions([1], 1)
    now = backend.now_us()
    insert(st, [row("a", now - 2000, partition=1), row("b", now - 1000, partition=1), row("later", now + HOUR, partition=1)])
    st.freeze(1)

    def refused(rows):
        raise RuntimeError("the other cell did not answer")
    with pytest.raises(RuntimeError):
        st.hand_over(1, now, 10, refused)
    assert backend.ids() == {"a", "b", "later"}  # kept here
    given: list[MovingRow] = []
    assert st.hand_over(1, now, 1, given.extend) == 1 and st.hand_over(1, now, 10, given.extend) == 1
    assert [r.id for r in given] == ["a", "b"] and st.hand_over(1, now, 10, given.extend) == 0
    assert backend.ids() == {"later"}


def test_a_row_a_claim_that_deletes_puts_back_keeps_its_input_partition(backend):
    firer = backend.store(uuid.uuid4())
    now = backend.now_us()
    insert(firer, [row("back", now - 2000, "K", partition=3), row("retry", now - 1000, partition=3)])
    takes = backend.takes(uuid.uuid4())
    taken = {c.id: c for c in takes.claim(10, 0)}
    takes.finish([taken["back"]], [(taken["retry"], "refused: X", 60_000)], [], "out")
    assert {m: backend.stored(m).input_partition for m in ("back", "retry")} == {"back": 3, "retry": 3}


def test_schedules_are_shipped_through_the_outbox_and_the_rest_dropped_here(s, backend):
    now = backend.now_us()
    insert(s, [row("daily", now + HOUR, partition=1, cron="0 9 * * *", timezone="Europe/Paris"),
               row("due", now - 1000, partition=1), row("later", now + HOUR, partition=1),
               row("p0", now - 1000, partition=0)])
    (shipped,) = s.ship_schedules(1)
    assert (shipped.id, shipped.cron, shipped.timezone) == ("daily", "0 9 * * *", "Europe/Paris")
    assert "daily" not in backend.ids()
    assert [r.id for r in s.ship_schedules(1)] == ["daily"]  # kept until the target has it
    s.shipped(1)
    assert s.ship_schedules(1) == []
    assert s.drop_due(1, now, 100) == 1 and backend.ids() == {"later", "p0"}
    cursor = 0
    while cursor is not None:
        cursor = s.drop_scan(1, cursor, 1000)
    assert backend.ids() == {"p0"}


def test_the_enqueue_order_goes_on_past_the_sources(s, backend):
    insert(s, [row("a", backend.now_us() + HOUR)])
    at = s.seq_position()
    s.seq_at_least(at + 1000)
    s.seq_at_least(at + 10)  # never back
    insert(s, [row("b", backend.now_us() + HOUR)])
    assert s.seq_position() == at + 1001


def test_live_firers_are_those_whose_lease_is_younger_than_the_hold_time(backend):
    st = backend.store(uuid.uuid4())
    assert st.live_firers(5000) == 0
    st.firer_heartbeat(5000)
    backend.store(uuid.uuid4()).firer_heartbeat(5000)
    assert st.live_firers(5000) == 2
    backend.age_leases(10)
    assert st.live_firers(5000) == 0
